//! What the OpenID CIBA endpoints (`ciba.rs`) keep: the registered clients, the key that
//! signs the tokens, the MAC key of `auth_req_id`s and the polling pace of pending requests.
//!
//! `auth_req_id` is `<approval id>.<MAC>`: the MAC, keyed by a secret derived from the
//! receipt key, binds it to the client, so nobody else's id (nor a guessed one) is accepted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use super::clients::Clients;
use crate::receipts::ReceiptKeys;

/// The default `interval` between polls, in seconds.
const DEFAULT_INTERVAL_SECONDS: u64 = 5;
/// How much `slow_down` adds to a client's interval (CIBA §11, as RFC 8628 §3.5).
const SLOW_DOWN_STEP_SECONDS: u64 = 5;
/// The MAC's purpose, for the key derived from the receipt key.
const MAC_PURPOSE: &str = "ciba auth_req_id";

/// What the CIBA endpoints keep: the clients, the key that signs tokens, and each pending
/// request's polling pace.
pub(crate) struct Ciba {
    pub(super) clients: Clients,
    pub(super) keys: Arc<ReceiptKeys>,
    mac_key: [u8; 32],
    pub(super) interval: u64,
    /// How long tokens are good for (the receipt's lifetime).
    pub(super) token_ttl_seconds: i64,
    /// approval id → when its client last polled and the interval it must keep.
    pacing: Mutex<HashMap<String, Pace>>,
}

struct Pace {
    last: Instant,
    interval: u64,
}

impl Ciba {
    pub(crate) fn new(
        clients: Clients,
        keys: Arc<ReceiptKeys>,
        interval_seconds: Option<u32>,
        token_ttl_seconds: u32,
    ) -> Ciba {
        Ciba {
            clients,
            mac_key: keys.derived_secret(MAC_PURPOSE),
            keys,
            interval: interval_seconds.map_or(DEFAULT_INTERVAL_SECONDS, u64::from),
            token_ttl_seconds: i64::from(token_ttl_seconds.max(60)),
            pacing: Mutex::new(HashMap::new()),
        }
    }

    /// Whether any client is registered.
    pub(super) fn has_clients(&self) -> bool {
        !self.clients.is_empty()
    }

    fn mac(&self, client_id: &str, approval_id: &str) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as hmac::Mac>::new_from_slice(&self.mac_key)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(client_id.as_bytes());
        mac.update(&[0]);
        mac.update(approval_id.as_bytes());
        mac
    }

    pub(super) fn auth_req_id(&self, client_id: &str, approval_id: &str) -> String {
        let tag = self.mac(client_id, approval_id).finalize().into_bytes();
        format!("{approval_id}.{}", URL_SAFE_NO_PAD.encode(tag))
    }

    /// The approval id of `auth_req_id` when it was issued to `client_id`.
    pub(super) fn approval_of(&self, client_id: &str, auth_req_id: &str) -> Option<String> {
        let (approval_id, tag) = auth_req_id.rsplit_once('.')?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        self.mac(client_id, approval_id)
            .verify_slice(&tag)
            .ok()
            .map(|()| approval_id.to_owned())
    }

    /// A poll of a pending request: `true` when it came sooner than its interval allows,
    /// which then grows by [`SLOW_DOWN_STEP_SECONDS`].
    pub(super) fn too_fast(&self, approval_id: &str, now: Instant) -> bool {
        let mut pacing = self.pacing.lock().unwrap_or_else(|e| e.into_inner());
        let forget_after = Duration::from_secs(7 * 24 * 3600);
        pacing.retain(|_, pace| now.duration_since(pace.last) < forget_after);
        let pace = pacing.entry(approval_id.to_owned()).or_insert(Pace {
            last: now,
            interval: self.interval,
        });
        let elapsed = now.duration_since(pace.last);
        let first = elapsed.is_zero();
        let fast = !first && elapsed < Duration::from_secs(pace.interval);
        if fast {
            pace.interval += SLOW_DOWN_STEP_SECONDS;
        }
        pace.last = now;
        fast
    }

    pub(super) fn settled(&self, approval_id: &str) {
        self.pacing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(approval_id);
    }
}
