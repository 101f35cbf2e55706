//! The page frame every page shows: who is signed in, their CSRF token, what they may see,
//! whether the inbox is connected to the server.

use crate::app::App;
use crate::auth::Viewer;

/// What the page frame shows.
pub struct Layout {
    pub(crate) name: String,
    pub(crate) approver_id: String,
    pub(crate) csrf: String,
    pub(crate) admin: bool,
    pub(crate) can_sign_out: bool,
    /// Whether the inbox is connected to the server (the page warns when not).
    pub(crate) linked: bool,
}

impl Layout {
    pub(crate) fn of(app: &App, viewer: &Viewer) -> Layout {
        Layout {
            name: viewer.approver.name.clone(),
            approver_id: viewer.approver.id.clone(),
            csrf: viewer.csrf.clone(),
            admin: viewer.admin,
            can_sign_out: viewer.has_session,
            linked: app.live.is_linked(),
        }
    }
}
