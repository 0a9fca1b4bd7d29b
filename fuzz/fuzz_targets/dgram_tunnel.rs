//! Fuzz the kernel tunnel (`onionlab_dgram::tunnel`): arbitrary bytes as
//! a packet from either end's kernel, as a segment from either end's
//! peer, and as a LINK message's data. Nothing may panic; a packet let
//! through yields a segment of its own bytes for a set that has the
//! packet's destination; a segment let in becomes a packet of one IPv4
//! header and the same segment (but its checksum), whose header checksum
//! holds; a LINK that parses encodes back to the same bytes.
#![no_main]

use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use onionlab_dgram::e2e::{link_msg, parse_link};
use onionlab_dgram::tunnel::{
    from_kernel, to_kernel, PeerAddrs, TunnelEnd, IPV4_HEADER, NODE_ADDR,
};

fuzz_target!(|data: &[u8]| {
    let mut addrs = PeerAddrs::default();
    for set in 1..=3 {
        addrs.assign(set);
    }
    for end in [TunnelEnd::Client, TunnelEnd::Exit] {
        if let Ok((set, segment)) = from_kernel(end, &addrs, data) {
            let dst = Ipv4Addr::new(data[16], data[17], data[18], data[19]);
            assert_eq!(addrs.set_of(dst), Some(set));
            let start = segment.as_ptr() as usize - data.as_ptr() as usize;
            assert!(start + segment.len() <= data.len());
        }
        let peer = addrs.addr_of(2).expect("set 2 has an address");
        if let Ok(packet) = to_kernel(end, peer, data) {
            assert_eq!(packet.len(), IPV4_HEADER + data.len());
            assert_eq!(&packet[12..16], &peer.octets());
            assert_eq!(&packet[16..20], &NODE_ADDR.octets());
            assert_eq!(&packet[IPV4_HEADER..IPV4_HEADER + 16], &data[..16]);
            assert_eq!(&packet[IPV4_HEADER + 18..], &data[18..]);
            let sum = packet[..IPV4_HEADER]
                .chunks(2)
                .fold(0u32, |acc, w| acc + u32::from(u16::from_be_bytes([w[0], w[1]])));
            let folded = (sum & 0xffff) + (sum >> 16);
            assert_eq!((folded & 0xffff) + (folded >> 16), 0xffff);
        }
    }
    if let Some((nonce, kernel)) = parse_link(data) {
        assert_eq!(link_msg(&nonce, kernel).data, data);
    }
});
