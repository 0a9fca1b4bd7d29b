//! The kernel tunnel: seed 004's TUN mode of mUDP-OR (`docs/datagram.md`
//! section 4), sans-IO. A set may carry the nodes' kernel TCP instead of
//! the user-space one: the client's kernel opens a TCP connection through
//! a TUN device to a virtual address that stands for the set's exit; the
//! exit's kernel, behind its own TUN device, accepts it on
//! [`TUNNEL_PORT`]. Each TCP segment travels alone in one SEGMENT
//! message, on the leg the set's scheduler picks, without its IP header:
//! as in the paper, each end rebuilds the packet with addresses of its
//! own ([`to_kernel`]), so neither end learns the other's addressing and
//! neither can address anything in the other's kernel but the tunnel's
//! port.
//!
//! Both ends number the same way: the node's TUN device has
//! [`NODE_ADDR`] in [`TUNNEL_NET`]; each set has a virtual peer address
//! in the same network ([`PeerAddrs`]): at the client the exit's, at the
//! exit the client's. The TUN device's MTU ([`TUNNEL_MTU`]) makes the
//! kernel's segments fit a message.
//!
//! What each end lets through, besides well-formed IPv4 and TCP:
//!
//! - from its kernel, only segments from [`NODE_ADDR`] to a set's
//!   address, and only on the tunnel's port (to it at the client, from
//!   it at the exit);
//! - from the peer, at the exit only segments to the tunnel's port (so a
//!   client reaches nothing else the exit's kernel listens on); at the
//!   client only segments from the tunnel's port and never a SYN without
//!   ACK (so an exit cannot open a connection to the client's kernel).
//!
//! Written here: IPv4 and TCP header checks and checksums are a few lines
//! each, and the crates that parse packets (smoltcp's wire module, used
//! by `onionlab-utcp`) would not rebuild them with other addresses.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use crate::wire::MSG_DATA_LEN;

/// The tunnels' network, at both ends: 100.64.0.0/10 (RFC 6598's shared
/// address space, which the lab's and a testbed's own addresses avoid).
pub const TUNNEL_NET: (Ipv4Addr, u8) = (Ipv4Addr::new(100, 64, 0, 0), 10);
/// The node's own address on its TUN device.
pub const NODE_ADDR: Ipv4Addr = Ipv4Addr::new(100, 64, 0, 1);
/// The port the exit's kernel accepts tunnel connections on.
pub const TUNNEL_PORT: u16 = 9040;
/// Bytes of an IPv4 header without options (as [`to_kernel`] writes).
pub const IPV4_HEADER: usize = 20;
/// The TUN devices' MTU: an IPv4 header and a segment that fits one
/// SEGMENT message, so the kernel's MSS is `TUNNEL_MTU - 40`.
pub const TUNNEL_MTU: usize = IPV4_HEADER + MSG_DATA_LEN;
/// Bytes of a TCP header without options.
const TCP_HEADER: usize = 20;
const PROTO_TCP: u8 = 6;
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

/// Which end of the tunnel a node is: the rules differ (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelEnd {
    /// The client: its kernel connects to [`TUNNEL_PORT`].
    Client,
    /// The exit: its kernel accepts on [`TUNNEL_PORT`].
    Exit,
}

/// Why a packet or segment was not let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TunnelDrop {
    /// Not IPv4, a bad header length or total length.
    #[error("not a well-formed IPv4 packet")]
    NotIpv4,
    /// A fragment (the MTU makes the kernel send none).
    #[error("an IPv4 fragment")]
    Fragment,
    /// Not TCP.
    #[error("not TCP")]
    NotTcp,
    /// A TCP header that does not fit, or a segment over a message.
    #[error("a malformed or oversized TCP segment")]
    BadSegment,
    /// Not from the node's tunnel address.
    #[error("not from the tunnel's address")]
    Source,
    /// To no set's address.
    #[error("to no set")]
    NoSet,
    /// Not on the tunnel's port, or a connection the end may not open.
    #[error("not on the tunnel's port or not allowed here")]
    Port,
}

/// Each set's virtual peer address in [`TUNNEL_NET`] (the client's for
/// the exit, the exit's for the client), both ways.
#[derive(Debug, Default)]
pub struct PeerAddrs {
    by_set: HashMap<u64, Ipv4Addr>,
    by_addr: HashMap<Ipv4Addr, u64>,
    /// The next host number to try.
    next: u32,
}

/// Host numbers in [`TUNNEL_NET`] a set may take: every one but the
/// network's, [`NODE_ADDR`]'s and the broadcast address.
const HOSTS: u32 = (1 << (32 - TUNNEL_NET.1)) - 3;

impl PeerAddrs {
    /// The set's address, taking a free one if it has none; `None` when
    /// every address is taken.
    pub fn assign(&mut self, set: u64) -> Option<Ipv4Addr> {
        if let Some(&addr) = self.by_set.get(&set) {
            return Some(addr);
        }
        if self.by_set.len() >= HOSTS as usize {
            return None;
        }
        let base = u32::from(TUNNEL_NET.0) + 2;
        let addr = loop {
            let addr = Ipv4Addr::from(base + self.next);
            self.next = (self.next + 1) % HOSTS;
            if !self.by_addr.contains_key(&addr) {
                break addr;
            }
        };
        self.by_set.insert(set, addr);
        self.by_addr.insert(addr, set);
        Some(addr)
    }

    /// The set's address, if it has one.
    pub fn addr_of(&self, set: u64) -> Option<Ipv4Addr> {
        self.by_set.get(&set).copied()
    }

    /// The set that has `addr`.
    pub fn set_of(&self, addr: Ipv4Addr) -> Option<u64> {
        self.by_addr.get(&addr).copied()
    }

    /// The set ended: its address is free again.
    pub fn release(&mut self, set: u64) -> Option<Ipv4Addr> {
        let addr = self.by_set.remove(&set)?;
        self.by_addr.remove(&addr);
        Some(addr)
    }

    /// Sets with an address.
    pub fn len(&self) -> usize {
        self.by_set.len()
    }

    /// Whether no set has an address.
    pub fn is_empty(&self) -> bool {
        self.by_set.is_empty()
    }
}

/// A packet the node's kernel wrote to its TUN device: the set it is for
/// and its TCP segment, to carry in a SEGMENT message.
///
/// # Errors
///
/// Why it may not go (module docs).
pub fn from_kernel<'p>(
    end: TunnelEnd,
    addrs: &PeerAddrs,
    packet: &'p [u8],
) -> Result<(u64, &'p [u8]), TunnelDrop> {
    let (src, dst, segment) = parse_ipv4_tcp(packet)?;
    if src != NODE_ADDR {
        return Err(TunnelDrop::Source);
    }
    let set = addrs.set_of(dst).ok_or(TunnelDrop::NoSet)?;
    let (src_port, dst_port) = ports(segment);
    let ours = match end {
        TunnelEnd::Client => dst_port == TUNNEL_PORT,
        TunnelEnd::Exit => src_port == TUNNEL_PORT,
    };
    if !ours {
        return Err(TunnelDrop::Port);
    }
    Ok((set, segment))
}

/// A segment the set's peer sent: the packet to write to the node's TUN
/// device, from the set's address `peer` to [`NODE_ADDR`], its checksums
/// computed for them.
///
/// # Errors
///
/// Why it may not go in (module docs).
pub fn to_kernel(end: TunnelEnd, peer: Ipv4Addr, segment: &[u8]) -> Result<Vec<u8>, TunnelDrop> {
    check_segment(segment)?;
    let (src_port, dst_port) = ports(segment);
    let flags = segment[13];
    let allowed = match end {
        TunnelEnd::Exit => dst_port == TUNNEL_PORT,
        TunnelEnd::Client => {
            src_port == TUNNEL_PORT && !(flags & TCP_SYN != 0 && flags & TCP_ACK == 0)
        }
    };
    if !allowed {
        return Err(TunnelDrop::Port);
    }
    let total = IPV4_HEADER + segment.len();
    let mut packet = Vec::with_capacity(total);
    packet.extend_from_slice(&[0x45, 0]);
    packet.extend_from_slice(&(total as u16).to_be_bytes());
    // Identification 0, don't fragment, TTL 64, TCP, checksum later.
    packet.extend_from_slice(&[0, 0, 0x40, 0, 64, PROTO_TCP, 0, 0]);
    packet.extend_from_slice(&peer.octets());
    packet.extend_from_slice(&NODE_ADDR.octets());
    let header_sum = !fold(sum(0, &packet));
    packet[10..12].copy_from_slice(&header_sum.to_be_bytes());
    packet.extend_from_slice(segment);
    let tcp = &mut packet[IPV4_HEADER..];
    tcp[16..18].copy_from_slice(&[0, 0]);
    let tcp_sum = !fold(sum(pseudo_header(peer, NODE_ADDR, tcp.len()), tcp));
    tcp[16..18].copy_from_slice(&tcp_sum.to_be_bytes());
    Ok(packet)
}

/// The source, destination and TCP segment of an IPv4 packet (its total
/// length, not the buffer's, bounds it).
fn parse_ipv4_tcp(packet: &[u8]) -> Result<(Ipv4Addr, Ipv4Addr, &[u8]), TunnelDrop> {
    let first = *packet.first().ok_or(TunnelDrop::NotIpv4)?;
    let header = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || header < IPV4_HEADER || packet.len() < header {
        return Err(TunnelDrop::NotIpv4);
    }
    let total = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
    if total < header || total > packet.len() {
        return Err(TunnelDrop::NotIpv4);
    }
    let more_fragments = packet[6] & 0x20 != 0;
    let offset = u16::from_be_bytes([packet[6] & 0x1f, packet[7]]);
    if more_fragments || offset != 0 {
        return Err(TunnelDrop::Fragment);
    }
    if packet[9] != PROTO_TCP {
        return Err(TunnelDrop::NotTcp);
    }
    let addr =
        |at: usize| Ipv4Addr::new(packet[at], packet[at + 1], packet[at + 2], packet[at + 3]);
    let segment = &packet[header..total];
    check_segment(segment)?;
    Ok((addr(12), addr(16), segment))
}

/// A TCP segment whose header fits and which fits a SEGMENT message.
fn check_segment(segment: &[u8]) -> Result<(), TunnelDrop> {
    if segment.len() < TCP_HEADER || segment.len() > MSG_DATA_LEN {
        return Err(TunnelDrop::BadSegment);
    }
    let header = usize::from(segment[12] >> 4) * 4;
    if header < TCP_HEADER || header > segment.len() {
        return Err(TunnelDrop::BadSegment);
    }
    Ok(())
}

/// A checked segment's source and destination ports.
fn ports(segment: &[u8]) -> (u16, u16) {
    (
        u16::from_be_bytes([segment[0], segment[1]]),
        u16::from_be_bytes([segment[2], segment[3]]),
    )
}

/// The TCP pseudo-header's sum (RFC 793).
fn pseudo_header(src: Ipv4Addr, dst: Ipv4Addr, tcp_len: usize) -> u32 {
    let mut p = [0u8; 12];
    p[..4].copy_from_slice(&src.octets());
    p[4..8].copy_from_slice(&dst.octets());
    p[9] = PROTO_TCP;
    p[10..].copy_from_slice(&(tcp_len as u16).to_be_bytes());
    sum(0, &p)
}

/// The Internet checksum's running sum of 16-bit words (RFC 1071).
fn sum(mut acc: u32, bytes: &[u8]) -> u32 {
    let mut words = bytes.chunks_exact(2);
    for w in &mut words {
        acc += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

/// The sum folded to 16 bits.
fn fold(mut acc: u32) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP segment from `src_port` to `dst_port` with `flags` and
    /// `payload` (checksum left 0: the tunnel recomputes it).
    fn segment(src_port: u16, dst_port: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut s = vec![0u8; TCP_HEADER];
        s[..2].copy_from_slice(&src_port.to_be_bytes());
        s[2..4].copy_from_slice(&dst_port.to_be_bytes());
        s[12] = 5 << 4;
        s[13] = flags;
        s.extend_from_slice(payload);
        s
    }

    /// A packet as the node's kernel writes it: from [`NODE_ADDR`].
    fn from_node(dst: Ipv4Addr, segment: &[u8]) -> Vec<u8> {
        // Build it as the other end would, then swap the addresses.
        let mut p = to_kernel(TunnelEnd::Exit, dst, &self::segment(1, TUNNEL_PORT, 0, &[]))
            .expect("packet");
        p.truncate(IPV4_HEADER);
        p[12..16].copy_from_slice(&NODE_ADDR.octets());
        p[16..20].copy_from_slice(&dst.octets());
        p[2..4].copy_from_slice(&((IPV4_HEADER + segment.len()) as u16).to_be_bytes());
        p.extend_from_slice(segment);
        p
    }

    #[test]
    fn rebuilt_packets_carry_valid_checksums() {
        let seg = segment(40000, TUNNEL_PORT, TCP_ACK, b"hello, odd length");
        let peer = Ipv4Addr::new(100, 64, 0, 7);
        let p = to_kernel(TunnelEnd::Exit, peer, &seg).expect("packet");
        assert_eq!(p.len(), IPV4_HEADER + seg.len());
        // A correct checksum sums, with itself, to all ones.
        assert_eq!(fold(sum(0, &p[..IPV4_HEADER])), 0xffff);
        let tcp = &p[IPV4_HEADER..];
        assert_eq!(
            fold(sum(pseudo_header(peer, NODE_ADDR, tcp.len()), tcp)),
            0xffff
        );
        let (src, dst, back) = parse_ipv4_tcp(&p).expect("parses");
        assert_eq!((src, dst), (peer, NODE_ADDR));
        assert_eq!(&back[20..], b"hello, odd length");
    }

    #[test]
    fn checksums_match_an_independent_computation() {
        // 100.64.0.7:40000 -> 100.64.0.1:9040, seq 0x01020304, PSH|ACK,
        // window 65535, "abc" (odd, so the pad byte counts); the sums as
        // a separate implementation (Python's struct) computed them.
        let mut seg = segment(40000, TUNNEL_PORT, 0x18, b"abc");
        seg[4..8].copy_from_slice(&0x0102_0304u32.to_be_bytes());
        seg[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
        let p = to_kernel(TunnelEnd::Exit, Ipv4Addr::new(100, 64, 0, 7), &seg).expect("packet");
        assert_eq!(&p[10..12], &0x7245u16.to_be_bytes(), "IPv4 header checksum");
        assert_eq!(
            &p[IPV4_HEADER + 16..IPV4_HEADER + 18],
            &0x5f48u16.to_be_bytes(),
            "TCP checksum"
        );
    }

    #[test]
    fn checksum_matches_rfc_1071_example() {
        // RFC 1071 section 3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        let bytes = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(0, &bytes)), 0xddf2);
    }

    #[test]
    fn exit_lets_in_only_the_tunnel_port() {
        let peer = Ipv4Addr::new(100, 64, 0, 9);
        let ok = segment(40000, TUNNEL_PORT, TCP_SYN, &[]);
        assert!(to_kernel(TunnelEnd::Exit, peer, &ok).is_ok());
        let ssh = segment(40000, 22, TCP_SYN, &[]);
        assert_eq!(
            to_kernel(TunnelEnd::Exit, peer, &ssh),
            Err(TunnelDrop::Port)
        );
    }

    #[test]
    fn client_refuses_connections_opened_by_the_exit() {
        let peer = Ipv4Addr::new(100, 64, 0, 9);
        let syn = segment(TUNNEL_PORT, 22, TCP_SYN, &[]);
        assert_eq!(
            to_kernel(TunnelEnd::Client, peer, &syn),
            Err(TunnelDrop::Port)
        );
        let syn_ack = segment(TUNNEL_PORT, 40000, TCP_SYN | TCP_ACK, &[]);
        assert!(to_kernel(TunnelEnd::Client, peer, &syn_ack).is_ok());
        let other_port = segment(80, 40000, TCP_ACK, &[]);
        assert_eq!(
            to_kernel(TunnelEnd::Client, peer, &other_port),
            Err(TunnelDrop::Port)
        );
    }

    #[test]
    fn from_kernel_finds_the_set_and_checks_the_port() {
        let mut addrs = PeerAddrs::default();
        let a = addrs.assign(3).expect("address");
        let seg = segment(40000, TUNNEL_PORT, TCP_ACK, b"x");
        let p = from_node(a, &seg);
        assert_eq!(
            from_kernel(TunnelEnd::Client, &addrs, &p),
            Ok((3, &seg[..]))
        );
        // The exit sends from the tunnel's port, not to it.
        assert_eq!(
            from_kernel(TunnelEnd::Exit, &addrs, &p),
            Err(TunnelDrop::Port)
        );
        let stranger = from_node(Ipv4Addr::new(100, 64, 9, 9), &seg);
        assert_eq!(
            from_kernel(TunnelEnd::Client, &addrs, &stranger),
            Err(TunnelDrop::NoSet)
        );
    }

    #[test]
    fn malformed_packets_are_dropped() {
        let mut addrs = PeerAddrs::default();
        let a = addrs.assign(1).expect("address");
        let good = from_node(a, &segment(1, TUNNEL_PORT, 0, &[]));
        let check = |p: &[u8]| from_kernel(TunnelEnd::Client, &addrs, p).err();
        assert_eq!(check(&[]), Some(TunnelDrop::NotIpv4));
        let mut v6 = good.clone();
        v6[0] = 0x60;
        assert_eq!(check(&v6), Some(TunnelDrop::NotIpv4));
        let mut long = good.clone();
        long[2..4].copy_from_slice(&1000u16.to_be_bytes());
        assert_eq!(check(&long), Some(TunnelDrop::NotIpv4));
        let mut frag = good.clone();
        frag[6] = 0x20;
        assert_eq!(check(&frag), Some(TunnelDrop::Fragment));
        let mut udp = good.clone();
        udp[9] = 17;
        assert_eq!(check(&udp), Some(TunnelDrop::NotTcp));
        let mut offset = good.clone();
        offset[IPV4_HEADER + 12] = 15 << 4;
        assert_eq!(check(&offset), Some(TunnelDrop::BadSegment));
        let mut spoofed = good.clone();
        spoofed[12..16].copy_from_slice(&[100, 64, 0, 2]);
        assert_eq!(check(&spoofed), Some(TunnelDrop::Source));
        let big = segment(1, TUNNEL_PORT, 0, &vec![0; MSG_DATA_LEN]);
        assert_eq!(
            to_kernel(TunnelEnd::Exit, a, &big),
            Err(TunnelDrop::BadSegment)
        );
    }

    #[test]
    fn addresses_are_unique_and_reused_after_release() {
        let mut addrs = PeerAddrs::default();
        let a = addrs.assign(1).expect("a");
        let b = addrs.assign(2).expect("b");
        assert_ne!(a, b);
        assert_ne!(a, NODE_ADDR);
        assert_eq!(addrs.assign(1), Some(a));
        assert_eq!(addrs.set_of(b), Some(2));
        assert_eq!(addrs.release(1), Some(a));
        assert_eq!(addrs.set_of(a), None);
        assert_eq!(addrs.len(), 1);
        // The pool wraps without handing out a taken address.
        addrs.next = HOSTS - 1;
        let c = addrs.assign(3).expect("c");
        let d = addrs.assign(4).expect("d");
        assert_eq!(u32::from(c), u32::from(TUNNEL_NET.0) + 2 + HOSTS - 1);
        assert_eq!(d, a, "the freed first address comes round again");
        assert_ne!(addrs.assign(5), Some(b));
    }
}
