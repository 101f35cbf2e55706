//! How people know a decider (or an editor), written once for every channel, the CLI and the
//! decision-link pages. Not escaped: each caller escapes it for its markup.

use crate::pb;

/// The display name, else the user id.
pub fn name(decider: &pb::Decider) -> &str {
    if decider.display_name.is_empty() {
        &decider.user_id
    } else {
        &decider.display_name
    }
}

/// "Alice (telegram)": the name and the channel the decider acted on.
pub fn name_and_channel(decider: &pb::Decider) -> String {
    format!("{} ({})", name(decider), decider.channel)
}
