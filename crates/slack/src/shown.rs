//! What is shown where: the message store the Slack and Discord workers share (one file per
//! approval, the intent on disk before each post, the `ts` after it).

pub use countersign_worker::shown::{is_newer, shown_key, Post, Store, StoreError};
