//! A node's endpoints, made from the endpoint kinds' setups
//! ([`EndpointSetup`], listed once here): a client's [`Connector`] opens
//! links with the endpoints its transport choice may use; a relay's
//! [`RelayEndpoints`] also binds one listener per address of its
//! `[listen]` table. Neither the node nor the client names a transport.

use std::net::IpAddr;

use onionlab_crypto::identity::RelaySecretKeys;

use crate::addrs::EndpointAddrs;
use crate::connector::Connector;
use crate::endpoint::{Admission, EndpointKind, Endpoints, Listeners};
use crate::setup::{BindError, EndpointSetup, RelaySetup};
use crate::{Error, LinkSettings};

/// Every endpoint kind's setup: one line each.
static SETUPS: &[&EndpointSetup] = &[
    &crate::tls::setup::SETUP,
    &crate::quic::setup::SETUP,
    &crate::utcp::setup::SETUP,
    &crate::datagram::setup::SETUP,
    #[cfg(feature = "test-transport")]
    &crate::plain::setup::SETUP,
];

fn setup_of(kind: EndpointKind) -> Result<&'static EndpointSetup, Error> {
    SETUPS
        .iter()
        .copied()
        .find(|s| s.kind == kind)
        .ok_or_else(|| Error::Config(format!("no setup for the {kind} endpoint")))
}

/// A relay's endpoints, bound.
pub struct RelayEndpoints {
    /// Opens links under the relay's transport choice.
    pub connector: Connector,
    /// Accepts links on every endpoint that listens.
    pub listeners: Listeners,
}

impl Connector {
    /// A client's connector for `link`: the endpoints its transport
    /// choice may use, each with `link`'s settings. A client never
    /// listens, so its endpoints only open links.
    ///
    /// # Errors
    ///
    /// An endpoint's, if it cannot be made (dtls-utcp's UDP socket).
    pub fn client(link: &LinkSettings) -> Result<Self, Error> {
        let mut endpoints = Endpoints::new();
        for kind in link.transport.endpoints() {
            endpoints.insert(kind, (setup_of(kind)?.client)(link)?);
        }
        Self::new(endpoints, link.transport)
    }
}

/// What the links of each endpoint kind `link`'s transport choice may use
/// put on the wire ([`EndpointSetup::wire`]), for an experiment's records.
pub fn wire_facts(link: &LinkSettings) -> Vec<(EndpointKind, Vec<(&'static str, String)>)> {
    link.transport
        .endpoints()
        .into_iter()
        .filter_map(|kind| Some((kind, (setup_of(kind).ok()?.wire)(link))))
        .collect()
}

impl RelayEndpoints {
    /// Set up and bind a relay's endpoints, one per address of `listen`,
    /// with `keys`, `link`'s settings and `admission`. `my_addrs` are the
    /// relay's own addresses (peers must not be them).
    ///
    /// # Errors
    ///
    /// [`BindError::Listen`] naming the address of the endpoint that
    /// failed; [`BindError::Setup`] for a transport choice whose endpoint
    /// the relay does not listen on (QUIC without a QUIC address), with
    /// the transport's name.
    pub async fn bind(
        keys: &RelaySecretKeys,
        my_addrs: &[IpAddr],
        link: &LinkSettings,
        listen: &EndpointAddrs,
        admission: &Admission,
    ) -> Result<Self, BindError> {
        let setup = RelaySetup {
            keys,
            my_addrs,
            link,
            admission,
        };
        let mut endpoints = Endpoints::new();
        let mut listeners = Listeners::new();
        for (kind, addr) in listen.iter() {
            let make = setup_of(kind).map_err(BindError::Setup)?.relay;
            let (endpoint, acceptor) = make(&setup, addr).await?;
            endpoints.insert(kind, endpoint);
            listeners.push(acceptor);
        }
        let connector = Connector::new(endpoints, link.transport).map_err(BindError::Setup)?;
        Ok(RelayEndpoints {
            connector,
            listeners,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_endpoint_kind_has_one_setup() {
        for kind in EndpointKind::all() {
            assert_eq!(
                SETUPS.iter().filter(|s| s.kind == kind).count(),
                1,
                "{kind}"
            );
        }
        assert_eq!(SETUPS.len(), EndpointKind::all().len());
    }
}
