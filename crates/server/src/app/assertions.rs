//! The use of an OpenID CIBA client assertion (`crate::standards`, `private_key_jwt`): its
//! `jti` is accepted once per client, remembered by the store (so on every replica and after a
//! restart) until the assertion expires.

use countersign_core::Millis;

use super::shared::App;
use crate::app::AppError;
use crate::store::now_millis;

impl App {
    /// Uses the assertion `jti` of `client_id`, which expires at `expires_at`: false when it
    /// was used before. The caller verified the assertion's signature first.
    pub async fn use_client_assertion(
        &self,
        client_id: &str,
        jti: &str,
        expires_at: Millis,
    ) -> Result<bool, AppError> {
        Ok(self
            .store
            .use_client_assertion(client_id, jti, expires_at, now_millis())
            .await?)
    }
}
