//! Flow control per tor-spec: circuit windows (1000 cells, SENDME every 100)
//! and stream windows (500 cells, SENDME every 50), with authenticated
//! SENDME v1 at the circuit level (tor proposal 289).
//!
//! Only DATA messages count against windows. The decision of how many DATA
//! cells a circuit may have in flight is behind [`CongestionControl`] (module
//! [`cc`](crate::cc)); which
//! one a circuit runs is its [`CircuitCc`]: tor-spec's fixed windows, or
//! proposal 324's Vegas with XON/XOFF stream flow control in place of the
//! stream windows.

use std::collections::VecDeque;
use std::time::Instant;
use subtle::ConstantTimeEq;

use onionlab_crypto::SendmeTag;

use crate::cc::{CcSnapshot, CongestionControl, FixedWindow};
pub use crate::cc::{CIRCWINDOW_INCREMENT, CIRCWINDOW_START};
use crate::vegas::{Vegas, VegasParams};
use crate::xonxoff::XonXoffParams;
use crate::ParamError;

/// Initial stream package/deliver window, in DATA cells.
pub const STREAMWINDOW_START: u32 = 500;
/// Cells acknowledged by one stream-level SENDME.
pub const STREAMWINDOW_INCREMENT: u32 = 50;

/// The circuit-level flow control of a circuit, the same at both of its
/// ends. onionlab speaks ntor v1 only, which has no room for proposal 324's
/// congestion-control extension, so a network chooses one for all its
/// circuits in its network document (`[params] circuit_cc`), as C tor's
/// consensus parameters `cc_alg` and `cc_*` do. A circuit keeps the choice
/// of the document it was built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CircuitCc {
    /// tor-spec's fixed windows: 1000 unacknowledged cells per circuit
    /// (SENDME every 100), 500 per stream (stream SENDME every 50).
    #[default]
    Fixed,
    /// Proposal 324: TOR_VEGAS decides the circuit window (SENDME every
    /// `cc_sendme_inc` cells), and XON/XOFF replaces the stream windows.
    Vegas {
        /// Vegas parameters.
        vegas: VegasParams,
        /// XON/XOFF parameters.
        xon: XonXoffParams,
    },
}

impl CircuitCc {
    /// Vegas with C tor's parameters.
    pub fn vegas() -> Self {
        CircuitCc::Vegas {
            vegas: VegasParams::default(),
            xon: XonXoffParams::default(),
        }
    }

    /// `"fixed"` or `"vegas"`, as in the network document.
    pub fn name(&self) -> &'static str {
        match self {
            CircuitCc::Fixed => "fixed",
            CircuitCc::Vegas { .. } => "vegas",
        }
    }

    /// Check the parameters' ranges (proposal 324 section 6.5).
    ///
    /// # Errors
    ///
    /// The first parameter out of its range.
    pub fn validate(&self) -> Result<(), ParamError> {
        match self {
            CircuitCc::Fixed => Ok(()),
            CircuitCc::Vegas { vegas, xon } => {
                vegas.validate()?;
                xon.validate()
            }
        }
    }

    /// The congestion-control parameters by their consensus names
    /// (proposal 324 section 6.5), with their values; none under fixed
    /// windows.
    pub fn params(&self) -> Vec<(&'static str, u32)> {
        let mut copy = *self;
        match &mut copy {
            CircuitCc::Fixed => Vec::new(),
            CircuitCc::Vegas { vegas, xon } => {
                let mut out: Vec<(&'static str, u32)> = vegas
                    .named_mut()
                    .into_iter()
                    .map(|(n, slot)| (n, slot.get()))
                    .collect();
                out.extend(xon.named_mut().into_iter().map(|(n, v)| (n, *v)));
                out
            }
        }
    }

    /// Set the parameter `name` (a consensus name of proposal 324 section
    /// 6.5, e.g. `cc_sendme_inc`). Call [`validate`](Self::validate) once
    /// all are set.
    ///
    /// # Errors
    ///
    /// An unknown name (listing the known ones), a parameter of Vegas under
    /// fixed windows, or a switch that is not 0 or 1.
    pub fn set_param(&mut self, name: &str, value: u32) -> Result<(), ParamError> {
        let CircuitCc::Vegas { vegas, xon } = self else {
            return Err(ParamError::FixedWindows {
                name: name.to_string(),
            });
        };
        let mut known = Vec::new();
        for (n, mut slot) in vegas.named_mut() {
            if n == name {
                return slot.set(name, value);
            }
            known.push(n);
        }
        for (n, v) in xon.named_mut() {
            if n == name {
                *v = value;
                return Ok(());
            }
            known.push(n);
        }
        Err(ParamError::Unknown {
            name: name.to_string(),
            known: known.join(", "),
        })
    }

    /// The XON/XOFF parameters, when streams use XON/XOFF.
    pub fn xon_xoff(&self) -> Option<XonXoffParams> {
        match self {
            CircuitCc::Fixed => None,
            CircuitCc::Vegas { xon, .. } => Some(*xon),
        }
    }

    /// The sending side of one hop.
    pub fn sender(&self) -> CircSender {
        match self {
            CircuitCc::Fixed => CircSender::default(),
            CircuitCc::Vegas { vegas, .. } => CircSender::new(Box::new(Vegas::new(*vegas))),
        }
    }

    /// The receiving side of one hop.
    pub fn receiver(&self) -> CircReceiver {
        match self {
            CircuitCc::Fixed => CircReceiver::default(),
            CircuitCc::Vegas { vegas, .. } => CircReceiver::congestion_controlled(vegas.sendme_inc),
        }
    }

    /// The most cells a relay queues per circuit and direction before it
    /// closes the circuit: 2500 under fixed windows (an honest peer keeps
    /// about 1000 DATA cells in flight), C tor's `circ_max_cell_queue_size`
    /// default of 50000 under Vegas (param-spec; no window bounds an honest
    /// sender, the relay's memory limit does).
    pub fn max_queue_cells(&self) -> usize {
        match self {
            CircuitCc::Fixed => 2500,
            CircuitCc::Vegas { .. } => 50_000,
        }
    }
}

/// Sending side of one circuit hop: the congestion-control decision plus
/// the SENDME v1 tags we expect back.
#[derive(Debug)]
pub struct CircSender {
    cc: Box<dyn CongestionControl>,
    data_sent: u64,
    /// Tags of every `sendme_inc`-th DATA cell sent, and when it was sent,
    /// oldest first.
    expected_tags: VecDeque<(SendmeTag, Instant)>,
    /// Time from sending the DATA cell the last SENDME acknowledged to
    /// receiving that SENDME.
    last_sendme_delay: Option<std::time::Duration>,
}

impl Default for CircSender {
    fn default() -> Self {
        Self::new(Box::<FixedWindow>::default())
    }
}

impl CircSender {
    /// A sender whose window is decided by `cc`.
    pub fn new(cc: Box<dyn CongestionControl>) -> Self {
        CircSender {
            cc,
            data_sent: 0,
            expected_tags: VecDeque::new(),
            last_sendme_delay: None,
        }
    }
    /// May a DATA cell be sent now?
    pub fn can_send(&self) -> bool {
        self.cc.can_send()
    }
    /// DATA cells that may still be sent.
    pub fn available(&self) -> u32 {
        self.cc.available()
    }
    /// The congestion control's state (None under fixed windows).
    pub fn snapshot(&self) -> Option<CcSnapshot> {
        self.cc.snapshot()
    }
    /// Whether the channel this hop sends on is blocked now
    /// ([`CongestionControl::set_channel_blocked`]).
    pub fn set_channel_blocked(&mut self, blocked: bool) {
        self.cc.set_channel_blocked(blocked);
    }
    /// Record a DATA cell sent; `tag` is the running digest after it.
    pub fn on_data_sent(&mut self, tag: SendmeTag, now: Instant) {
        self.data_sent += 1;
        if self
            .data_sent
            .is_multiple_of(u64::from(self.cc.sendme_inc()))
        {
            self.expected_tags.push_back((tag, now));
        }
        self.cc.on_data_sent(now);
    }
    /// Handle a circuit-level SENDME. `tag` is its v1 authenticator (None
    /// for a v0 SENDME, which we refuse: every onionlab node speaks v1).
    pub fn on_sendme(&mut self, tag: Option<&[u8]>, now: Instant) -> Result<(), &'static str> {
        let (expected, sent_at) = self
            .expected_tags
            .pop_front()
            .ok_or("circuit SENDME acknowledges cells that were never sent")?;
        match tag {
            None => return Err("unauthenticated (v0) circuit SENDME"),
            // Constant time, as tor compares SENDME digests: how long the
            // comparison takes must not tell a forger how much was right.
            Some(t) if !bool::from(t.ct_eq(expected.as_slice())) => {
                return Err("circuit SENDME tag mismatch")
            }
            Some(_) => {}
        }
        self.last_sendme_delay = Some(now.saturating_duration_since(sent_at));
        self.cc.on_sendme(now);
        Ok(())
    }

    /// Time from sending the DATA cell the last SENDME acknowledged (the
    /// `sendme_inc`-th since the one before) to receiving that SENDME: an
    /// RTT sample under any congestion control, and Conflux 2013's
    /// congestion estimate under fixed windows (the 100th cell).
    pub fn last_sendme_delay(&self) -> Option<std::time::Duration> {
        self.last_sendme_delay
    }
}

/// Receiving side of one circuit hop: counts DATA cells and says when a
/// SENDME is due.
#[derive(Debug, Clone)]
pub struct CircReceiver {
    /// Cells acknowledged by one SENDME.
    sendme_inc: u32,
    /// Fixed windows: DATA cells the peer may still send. Under congestion
    /// control no window binds the sender (`None`).
    deliver_window: Option<u32>,
    /// Cells received since the last SENDME.
    since_sendme: u32,
}

impl Default for CircReceiver {
    fn default() -> Self {
        CircReceiver {
            sendme_inc: CIRCWINDOW_INCREMENT,
            deliver_window: Some(CIRCWINDOW_START),
            since_sendme: 0,
        }
    }
}

impl CircReceiver {
    /// The receiver of a congestion-controlled circuit: a SENDME every
    /// `sendme_inc` cells, no window (proposal 324 section 4: the sender's
    /// window is its own; a sender that overruns it only fills queues,
    /// which the relay's queue and memory limits bound).
    pub fn congestion_controlled(sendme_inc: u32) -> Self {
        CircReceiver {
            sendme_inc: sendme_inc.max(1),
            deliver_window: None,
            since_sendme: 0,
        }
    }

    /// A DATA cell arrived whose running digest is `tag`. Returns the tag to
    /// put in a SENDME if one is due now.
    ///
    /// Like tor, the SENDME goes out as soon as `sendme_inc` cells have
    /// arrived, so the window is credited at once and a receiver cannot
    /// see an overrun at this level: the sender side
    /// ([`CircSender::on_sendme`]) and the stream windows or XOFF limits,
    /// which follow consumption, catch misbehaving peers. The error is
    /// kept for congestion-control variants that delay SENDMEs.
    pub fn on_data(&mut self, tag: SendmeTag) -> Result<Option<SendmeTag>, &'static str> {
        if let Some(w) = &mut self.deliver_window {
            *w = w.checked_sub(1).ok_or("peer exceeded the circuit window")?;
        }
        self.since_sendme += 1;
        if self.since_sendme < self.sendme_inc {
            return Ok(None);
        }
        self.since_sendme = 0;
        if let Some(w) = &mut self.deliver_window {
            *w += self.sendme_inc;
        }
        Ok(Some(tag))
    }
}

/// Stream-level windows of one stream endpoint.
#[derive(Debug, Clone)]
pub struct StreamWindows {
    /// DATA cells we may still send.
    pub package: u32,
    /// DATA cells the peer may still send.
    pub deliver: u32,
}

impl Default for StreamWindows {
    fn default() -> Self {
        StreamWindows {
            package: STREAMWINDOW_START,
            deliver: STREAMWINDOW_START,
        }
    }
}

impl StreamWindows {
    /// A stream-level SENDME arrived.
    pub fn on_sendme(&mut self) -> Result<(), &'static str> {
        let w = self.package + STREAMWINDOW_INCREMENT;
        if w > STREAMWINDOW_START {
            return Err("stream SENDME beyond the stream window");
        }
        self.package = w;
        Ok(())
    }
    /// A DATA cell arrived.
    pub fn on_data(&mut self) -> Result<(), &'static str> {
        self.deliver = self
            .deliver
            .checked_sub(1)
            .ok_or("peer exceeded the stream window")?;
        Ok(())
    }
    /// Given how many received cells are still unread by the application,
    /// should a stream SENDME be sent now? If so the window is credited.
    ///
    /// Keeps `deliver + unread <= STREAMWINDOW_START`, so a stream never
    /// buffers more than one window of data however slowly it is read.
    pub fn take_sendme(&mut self, unread_cells: usize) -> bool {
        let unread = u32::try_from(unread_cells).unwrap_or(u32::MAX);
        if self.deliver.saturating_add(unread) <= STREAMWINDOW_START - STREAMWINDOW_INCREMENT {
            self.deliver += STREAMWINDOW_INCREMENT;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(i: u64) -> SendmeTag {
        let mut t = [0u8; 20];
        t[..8].copy_from_slice(&i.to_be_bytes());
        t
    }

    #[test]
    fn sender_and_receiver_agree_on_tags() {
        let now = Instant::now();
        let mut s = CircSender::default();
        let mut r = CircReceiver::default();
        let mut sent = 0u64;
        for round in 0..30 {
            while s.can_send() {
                sent += 1;
                s.on_data_sent(tag(sent), now);
            }
            assert_eq!(sent, 1000 + round * 100);
            // The receiver sees the same cells and acknowledges the first 100 outstanding.
            let start = sent - 1000 + 1;
            let mut sendme = None;
            for i in start..start + 100 {
                if let Some(t) = r.on_data(tag(i)).unwrap() {
                    sendme = Some(t);
                }
            }
            let t = sendme.expect("a SENDME is due after 100 cells");
            s.on_sendme(Some(&t), now).unwrap();
        }
    }

    #[test]
    fn the_sendme_delay_runs_from_the_acknowledged_cell_to_its_sendme() {
        let t0 = Instant::now();
        let ms = std::time::Duration::from_millis;
        let mut s = CircSender::default();
        assert_eq!(s.last_sendme_delay(), None);
        // Cells 1..=200 sent 1 ms apart; the 100th at t0 + 99 ms.
        for i in 1..=200u64 {
            s.on_data_sent(tag(i), t0 + ms(i - 1));
        }
        s.on_sendme(Some(&tag(100)), t0 + ms(250)).unwrap();
        assert_eq!(s.last_sendme_delay(), Some(ms(151)));
        s.on_sendme(Some(&tag(200)), t0 + ms(300)).unwrap();
        assert_eq!(s.last_sendme_delay(), Some(ms(101)));
    }

    #[test]
    fn forged_or_unexpected_sendme_is_refused() {
        let now = Instant::now();
        let mut s = CircSender::default();
        assert!(s.on_sendme(Some(&[0; 20]), now).is_err());
        for i in 1..=100 {
            s.on_data_sent(tag(i), now);
        }
        assert!(s.on_sendme(Some(&tag(99)), now).is_err());
        let mut s2 = CircSender::default();
        for i in 1..=100 {
            s2.on_data_sent(tag(i), now);
        }
        assert!(s2.on_sendme(None, now).is_err());
    }

    #[test]
    fn stream_sendme_follows_consumption() {
        let mut w = StreamWindows::default();
        for _ in 0..500 {
            w.on_data().unwrap();
        }
        assert!(w.on_data().is_err());
        // Nothing read yet: no SENDME, the buffer already holds a full window.
        assert!(!w.take_sendme(500));
        assert!(!w.take_sendme(451));
        assert!(w.take_sendme(450));
        assert_eq!(w.deliver, 50);
        assert!(!w.take_sendme(450));
        let mut p = StreamWindows::default();
        assert!(p.on_sendme().is_err());
    }

    #[test]
    fn vegas_parameters_are_set_by_their_consensus_names() {
        let mut cc = CircuitCc::vegas();
        let names: Vec<&str> = cc.params().iter().map(|(n, _)| *n).collect();
        assert_eq!(names.len(), 25, "20 Vegas and 5 XON/XOFF parameters");
        for (name, value) in [
            ("cc_sendme_inc", 20),
            ("cc_xoff_exit", 600),
            ("cc_cwnd_full_per_cwnd", 0),
        ] {
            cc.set_param(name, value).expect(name);
            assert!(cc.params().contains(&(name, value)), "{name}");
        }
        assert_eq!(cc.sender().available(), 124);
        assert_eq!(
            cc.set_param("cc_cwnd_full_per_cwnd", 2),
            Err(ParamError::NotSwitch {
                name: "cc_cwnd_full_per_cwnd".into(),
                value: 2
            })
        );
        assert!(matches!(
            cc.set_param("cc_nonsense", 1),
            Err(ParamError::Unknown { known, .. }) if known.contains("cc_sendme_inc")
        ));
        assert_eq!(
            CircuitCc::Fixed.set_param("cc_sendme_inc", 31),
            Err(ParamError::FixedWindows {
                name: "cc_sendme_inc".into()
            })
        );
        cc.set_param("cc_sendme_inc", 0).expect("set");
        assert!(matches!(
            cc.validate(),
            Err(ParamError::OutOfRange {
                name: "cc_sendme_inc",
                value: 0,
                ..
            })
        ));
    }

    #[test]
    fn vegas_sender_and_receiver_agree_on_tags_every_31_cells() {
        let cc = CircuitCc::vegas();
        let (mut s, mut r) = (cc.sender(), cc.receiver());
        let mut now = Instant::now();
        let mut sent = 0u64;
        let mut acked = 0u64;
        for _ in 0..200 {
            while s.can_send() {
                sent += 1;
                s.on_data_sent(tag(sent), now);
            }
            now += std::time::Duration::from_millis(50);
            // The receiver sees every cell in flight and acknowledges them.
            while acked < sent {
                acked += 1;
                if let Some(t) = r.on_data(tag(acked)).expect("no window") {
                    s.on_sendme(Some(&t), now)
                        .expect("the tag the sender expects");
                }
            }
        }
        let snap = s.snapshot().expect("vegas");
        assert!(snap.rtt.samples > 0 && snap.cwnd > 124, "{snap:?}");
    }

    #[test]
    fn a_vegas_receiver_acknowledges_every_sendme_inc_cells_without_a_window() {
        let mut r = CircuitCc::vegas().receiver();
        let mut sendmes = 0;
        for i in 1..=31 * 100 {
            if r.on_data(tag(i)).expect("no window").is_some() {
                sendmes += 1;
                assert_eq!(i % 31, 0, "a SENDME after each 31 cells");
            }
        }
        assert_eq!(sendmes, 100);
    }
}
