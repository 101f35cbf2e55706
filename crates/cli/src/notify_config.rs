//! `[notify]` in the local instance's config file: the quiet hours of `notify`'s notices.

use serde::Deserialize;

/// `[notify]` in the local instance's config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifySection {
    /// `HH:MM-HH:MM`: no notices from the first time until the second (across midnight when
    /// the second is earlier), at `utc_offset`.
    pub quiet_hours: Option<String>,
    /// `+HH:MM` or `-HH:MM`, the offset the quiet hours are in (default `+00:00`).
    pub utc_offset: Option<String>,
}

/// The quiet hours, as minutes of the day in UTC: from `start` until `end`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuietHours {
    start: i32,
    end: i32,
}

const MINUTES_PER_DAY: i32 = 24 * 60;

impl NotifySection {
    /// The quiet hours this section sets, checked; `None` when it sets none.
    pub fn quiet_hours(&self) -> Result<Option<QuietHours>, String> {
        let Some(window) = &self.quiet_hours else {
            return Ok(None);
        };
        let offset = match &self.utc_offset {
            None => 0,
            Some(text) => {
                let (sign, rest) = match text.split_at_checked(1) {
                    Some(("+", rest)) => (1, rest),
                    Some(("-", rest)) => (-1, rest),
                    _ => {
                        return Err(format!(
                            "notify.utc_offset {text:?} is not +HH:MM or -HH:MM"
                        ))
                    }
                };
                sign * minute_of_day(rest)
                    .ok_or_else(|| format!("notify.utc_offset {text:?} is not +HH:MM or -HH:MM"))?
            }
        };
        let (start, end) = window
            .split_once('-')
            .and_then(|(start, end)| Some((minute_of_day(start)?, minute_of_day(end)?)))
            .ok_or_else(|| format!("notify.quiet_hours {window:?} is not HH:MM-HH:MM"))?;
        Ok(Some(QuietHours {
            start: (start - offset).rem_euclid(MINUTES_PER_DAY),
            end: (end - offset).rem_euclid(MINUTES_PER_DAY),
        }))
    }
}

impl QuietHours {
    /// Whether `minute` (of the day, UTC) is quiet.
    pub fn contains(self, minute: i32) -> bool {
        if self.start <= self.end {
            (self.start..self.end).contains(&minute)
        } else {
            minute >= self.start || minute < self.end
        }
    }
}

/// `HH:MM` as minutes since midnight.
fn minute_of_day(text: &str) -> Option<i32> {
    let (hours, minutes) = text.trim().split_once(':')?;
    let (hours, minutes): (i32, i32) = (hours.parse().ok()?, minutes.parse().ok()?);
    ((0..24).contains(&hours) && (0..60).contains(&minutes)).then_some(hours * 60 + minutes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_hours_wrap_midnight_and_follow_the_offset() {
        let section = |window: &str, offset: Option<&str>| NotifySection {
            quiet_hours: Some(window.into()),
            utc_offset: offset.map(str::to_owned),
        };
        let night = section("22:00-07:00", None).quiet_hours().unwrap().unwrap();
        assert!(night.contains(23 * 60) && night.contains(60) && !night.contains(12 * 60));
        assert!(night.contains(22 * 60) && !night.contains(7 * 60));
        // 22:00 to 07:00 at +02:00 is 20:00 to 05:00 UTC.
        let east = section("22:00-07:00", Some("+02:00"))
            .quiet_hours()
            .unwrap()
            .unwrap();
        assert!(east.contains(20 * 60) && !east.contains(6 * 60));
        assert!(section("25:00-07:00", None).quiet_hours().is_err());
        assert!(section("22:00-07:00", Some("2")).quiet_hours().is_err());
        assert_eq!(NotifySection::default().quiet_hours(), Ok(None));
    }
}
