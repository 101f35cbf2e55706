//! Operator commands beyond the plain approval calls: policies (`policy test`, `lint`,
//! `report`, `preset`), suggested rules, and editing arguments before approving them.

pub mod edit;
pub mod policy;
pub mod policy_report;
pub mod receipt;
pub mod rules_suggest;
