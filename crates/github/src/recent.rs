//! A set that remembers only the last N values inserted: duplicate detection over a window
//! (webhook delivery ids, comment ids) without growing forever.

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;

pub struct RecentSet<T> {
    capacity: usize,
    order: VecDeque<T>,
    members: HashSet<T>,
}

impl<T: Clone + Eq + Hash> RecentSet<T> {
    pub fn new(capacity: usize) -> RecentSet<T> {
        RecentSet {
            capacity: capacity.max(1),
            order: VecDeque::new(),
            members: HashSet::new(),
        }
    }

    pub fn contains(&self, value: &T) -> bool {
        self.members.contains(value)
    }

    /// Adds `value`; false when it was already there. The oldest value goes when full.
    pub fn insert(&mut self, value: T) -> bool {
        if !self.members.insert(value.clone()) {
            return false;
        }
        self.order.push_back(value);
        if self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.members.remove(&oldest);
            }
        }
        true
    }

    pub fn remove(&mut self, value: &T) {
        if self.members.remove(value) {
            self.order.retain(|member| member != value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_last_values_only() {
        let mut set = RecentSet::new(2);
        assert!(set.insert(1));
        assert!(!set.insert(1));
        assert!(set.insert(2));
        assert!(set.insert(3));
        assert!(!set.contains(&1));
        assert!(set.contains(&2) && set.contains(&3));
        set.remove(&2);
        assert!(!set.contains(&2));
        assert!(set.insert(2));
    }
}
