//! One figure per measurement, printed as a table or as JSON.

use serde::Serialize;

use crate::load::Summary;

#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub name: String,
    /// Operations completed in the measured window.
    pub operations: Option<u64>,
    /// Completed operations per second (for latency-at-rate figures: the offered rate).
    pub per_second: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// Throughput over the baseline's throughput, or latency over the baseline's latency
    /// (see `ratio_of`).
    pub ratio: Option<f64>,
    pub ratio_of: Option<&'static str>,
    pub errors: u64,
    pub first_error: Option<String>,
    pub note: String,
    /// Figures that are not rates or latencies (bytes per idle stream, mean commit batch).
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Figure {
    pub fn throughput(name: impl Into<String>, summary: &Summary) -> Figure {
        Figure {
            name: name.into(),
            operations: Some(summary.ops),
            per_second: Some(summary.per_second),
            p50_ms: Some(summary.p50_ms),
            p99_ms: Some(summary.p99_ms),
            max_ms: Some(summary.max_ms),
            ratio: None,
            ratio_of: None,
            errors: summary.errors,
            first_error: summary.first_error.clone(),
            note: String::new(),
            extra: serde_json::Map::new(),
        }
    }

    pub fn other(name: impl Into<String>, note: String) -> Figure {
        Figure {
            name: name.into(),
            operations: None,
            per_second: None,
            p50_ms: None,
            p99_ms: None,
            max_ms: None,
            ratio: None,
            ratio_of: None,
            errors: 0,
            first_error: None,
            note,
            extra: serde_json::Map::new(),
        }
    }

    /// Sets the ratio of this figure's throughput to the baseline's.
    pub fn against_throughput(&mut self, baseline: &Figure) {
        if let (Some(mine), Some(base)) = (self.per_second, baseline.per_second) {
            if base > 0.0 {
                self.ratio = Some(mine / base);
                self.ratio_of = Some("throughput");
            }
        }
    }

    /// Adds this figure's throughput over the storage floor's (`floor` per second) to its
    /// note and its extra figures.
    pub fn against_floor(&mut self, floor: f64) {
        if let Some(mine) = self.per_second.filter(|_| floor > 0.0) {
            let ratio = mine / floor;
            let note = format!("{ratio:.2}x the storage floor");
            self.note = match self.note.is_empty() {
                true => note,
                false => format!("{note}, {}", self.note),
            };
            self.extra
                .insert("floor_ratio".into(), serde_json::json!(ratio));
        }
    }

    /// Sets the ratio of this figure's median latency to the baseline's.
    pub fn against_latency(&mut self, baseline: &Figure) {
        if let (Some(mine), Some(base)) = (self.p50_ms, baseline.p50_ms) {
            if base > 0.0 {
                self.ratio = Some(mine / base);
                self.ratio_of = Some("p50 latency");
            }
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: String,
    pub concurrency: usize,
    pub connections: usize,
    pub duration_secs: f64,
    pub message_bytes: usize,
    pub figures: Vec<Figure>,
}

fn cell(value: Option<f64>, decimals: usize) -> String {
    match value {
        Some(v) => format!("{v:.decimals$}"),
        None => "-".to_string(),
    }
}

fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl Report {
    pub fn table(&self) -> String {
        let mut out = format!(
            "countersign-bench on {} — concurrency {}, {} connections, {:.0} s per figure, {}-byte request\n\n",
            self.machine, self.concurrency, self.connections, self.duration_secs, self.message_bytes
        );
        let name_width = self
            .figures
            .iter()
            .map(|f| f.name.chars().count())
            .max()
            .unwrap_or(6)
            .max(6);
        out.push_str(&format!(
            "{:<name_width$}  {:>9}  {:>8}  {:>8}  {:>8}  {:>14}  {:>6}  note\n",
            "figure", "ops/s", "p50 ms", "p99 ms", "max ms", "vs baseline", "errors"
        ));
        out.push_str(&format!("{}\n", "-".repeat(name_width + 72)));
        for f in &self.figures {
            let ratio = match (f.ratio, f.ratio_of) {
                (Some(r), Some("throughput")) => format!("{r:.2}x ops/s"),
                (Some(r), Some(_)) => format!("{r:.1}x p50"),
                _ => "-".to_string(),
            };
            out.push_str(&format!(
                "{:<name_width$}  {:>9}  {:>8}  {:>8}  {:>8}  {:>14}  {:>6}  {}\n",
                f.name,
                f.per_second.map(thousands).unwrap_or_else(|| "-".into()),
                cell(f.p50_ms, 2),
                cell(f.p99_ms, 2),
                cell(f.max_ms, 1),
                ratio,
                f.errors,
                f.note
            ));
        }
        let failures: Vec<_> = self
            .figures
            .iter()
            .filter_map(|f| f.first_error.as_ref().map(|e| format!("  {}: {e}", f.name)))
            .collect();
        if !failures.is_empty() {
            out.push_str("\nfirst error of each figure with errors:\n");
            out.push_str(&failures.join("\n"));
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(1234567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1000.0), "1,000");
    }
}
