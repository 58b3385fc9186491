//! Everything a benchmark invocation measured, and its renderings (pure apart from the file
//! writes at the end): the terminal table, the CSV files and docs/benchmarks.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::BenchError;
use super::stats::{self, Impl, Row, Sample, Target, Verdict};

/// A series for the plots: `(seconds, value)` points of one run.
#[derive(Clone, Debug)]
pub struct Curve {
    /// `a_bound`, `b_bound` (claims Bound), `c_remaining`, `c_remaining_fast` (PVs left),
    /// `a_rss`, `b_rss`, `d_rss` (MiB); `j_bound` (claims Bound), `j_rss` (MiB, all sidecars).
    pub name: &'static str,
    pub imp: Impl,
    pub round: u32,
    pub points: Vec<(f64, f64)>,
}

/// Requests of one phase of one run, per volume, by verb and resource (all clients).
#[derive(Clone, Debug)]
pub struct RequestRow {
    pub scenario: &'static str,
    pub imp: Impl,
    pub round: u32,
    pub phase: &'static str,
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub per_volume: f64,
}

/// One run of one scenario.
#[derive(Clone, Debug)]
pub struct RunRecord {
    pub scenario: &'static str,
    pub imp: Option<Impl>,
    pub round: u32,
    pub wall_secs: f64,
    /// 1-minute load average when the run started (other work on the machine shows here).
    pub load: f64,
    pub error: Option<String>,
}

#[derive(Default)]
pub struct Results {
    pub samples: Vec<Sample>,
    pub curves: Vec<Curve>,
    pub requests: Vec<RequestRow>,
    pub runs: Vec<RunRecord>,
    /// Scenarios that could not run at all, with the reason.
    pub unavailable: Vec<(&'static str, String)>,
}

impl Results {
    pub fn sample(&mut self, metric: stats::Metric, imp: Option<Impl>, round: u32, value: f64) {
        self.samples.push(Sample {
            metric: metric.id,
            imp,
            round,
            value,
        });
    }
}

/// What the report says about how it was produced.
pub struct Context<'a> {
    pub command: &'a str,
    pub generated: &'a str,
    pub total_secs: f64,
    pub machine: &'a [(String, String)],
    pub method: &'a [(String, String)],
    pub rounds: u32,
    pub plots: &'a [(&'static str, &'static str)],
    pub plot_error: Option<&'a str>,
}

fn fmt_value(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

fn fmt_target(row: &Row) -> String {
    if row.metric.id == stats::B_OF_G.id {
        return format!("≥ {:.2}", stats::B_OF_G_TARGET);
    }
    match row.metric.target {
        Target::RatioAtMost(limit) => format!("ratio ≤ {limit:.2}"),
        Target::OursBelow(limit) => format!("ours < {limit} {}", row.metric.unit),
        Target::None => String::new(),
    }
}

fn fmt_verdict(v: Verdict) -> &'static str {
    match v {
        Verdict::Met => "met",
        Verdict::Missed => "MISSED",
        Verdict::NoTarget => "",
        Verdict::NotMeasured => "not measured",
    }
}

/// The terminal table.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<3} {:<72} {:>5} {:>9} {:>9} {:>8}  {:<16} verdict",
        "", "metric (medians)", "unit", "ours", "upstream", "ours÷up", "target"
    );
    for row in rows {
        let (ours, upstream) = match row.neutral {
            Some(v) => (Some(v), None),
            None => (row.ours, row.upstream),
        };
        let _ = writeln!(
            out,
            "{:<3} {:<72} {:>5} {:>9} {:>9} {:>8}  {:<16} {}",
            row.metric.scenario,
            row.metric.label,
            row.metric.unit,
            fmt_value(ours),
            fmt_value(upstream),
            fmt_value(row.ratio),
            fmt_target(row),
            fmt_verdict(row.verdict)
        );
    }
    out
}

fn markdown_table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| | metric | unit | ours | upstream | ours ÷ upstream | target | verdict |\n|---|---|---|--:|--:|--:|---|---|\n",
    );
    for row in rows {
        let (ours, upstream) = match row.neutral {
            Some(v) => (fmt_value(Some(v)), String::new()),
            None => (fmt_value(row.ours), fmt_value(row.upstream)),
        };
        let verdict = match row.verdict {
            Verdict::Missed => "**missed**".to_owned(),
            v => fmt_verdict(v).to_owned(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row.metric.scenario,
            row.metric.label,
            row.metric.unit,
            ours,
            upstream,
            fmt_value(row.ratio),
            fmt_target(row),
            verdict
        );
    }
    out
}

/// Median per volume of each (phase, verb, resource) over the rounds, ours beside upstream.
fn requests_table(requests: &[RequestRow], scenario: &str) -> String {
    type Key = (&'static str, String, String, String);
    let mut values: BTreeMap<Key, BTreeMap<Impl, Vec<f64>>> = BTreeMap::new();
    let mut rounds: BTreeMap<Impl, std::collections::BTreeSet<u32>> = BTreeMap::new();
    for r in requests.iter().filter(|r| r.scenario == scenario) {
        rounds.entry(r.imp).or_default().insert(r.round);
        values
            .entry((
                r.phase,
                r.verb.clone(),
                r.resource.clone(),
                r.subresource.clone(),
            ))
            .or_default()
            .entry(r.imp)
            .or_default()
            .push(r.per_volume);
    }
    if values.is_empty() {
        return String::new();
    }
    let mut out =
        String::from("| phase | verb | resource | ours | upstream |\n|---|---|---|--:|--:|\n");
    for ((phase, verb, resource, sub), by_impl) in &values {
        let resource = if sub.is_empty() {
            resource.clone()
        } else {
            format!("{resource}/{sub}")
        };
        // A run without a row for this key made none of these requests: count it as zero.
        let med = |imp: Impl| {
            let mut v = by_impl.get(&imp).cloned().unwrap_or_default();
            let n = rounds.get(&imp).map_or(0, |r| r.len());
            v.resize(n.max(v.len()), 0.0);
            stats::median(&v)
        };
        let _ = writeln!(
            out,
            "| {phase} | {verb} | {resource} | {} | {} |",
            fmt_value(med(Impl::Ours)),
            fmt_value(med(Impl::Upstream))
        );
    }
    out
}

const NOTES_BEGIN: &str = "<!-- notes:begin (kept when the report is regenerated) -->";
const NOTES_END: &str = "<!-- notes:end -->";

/// The hand-written analysis between the markers of an earlier report, if any.
pub fn kept_notes(previous: &str) -> Option<&str> {
    let start = previous.find(NOTES_BEGIN)? + NOTES_BEGIN.len();
    let end = previous[start..].find(NOTES_END)? + start;
    Some(previous[start..end].trim_matches('\n'))
}

pub fn markdown(results: &Results, ctx: &Context<'_>, notes: Option<&str>) -> String {
    let rows = stats::summarize(&results.samples);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Benchmarks: csi-provisioner-rs vs. upstream external-provisioner {}\n",
        super::env::UPSTREAM_VERSION
    );
    let _ = writeln!(
        md,
        "Generated by `{}` on {} in {:.0} min ({} round(s), each scenario run for ours then upstream, \
         alternately). Do not edit by hand except between the notes markers; run the command again instead.\n",
        ctx.command,
        ctx.generated,
        ctx.total_secs / 60.0,
        ctx.rounds
    );
    md.push_str("## Results\n\nMedians over the rounds; ratios are ours ÷ upstream (below 1 is better for times, memory, CPU and requests, worse for rates).\n\n");
    md.push_str(&markdown_table(&rows));
    let missed: Vec<&Row> = rows
        .iter()
        .filter(|r| r.verdict == Verdict::Missed)
        .collect();
    md.push_str("\n### Where we stand\n\n");
    if rows.is_empty() {
        md.push_str("Nothing was measured in this invocation.\n");
    }
    for row in &rows {
        if matches!(row.verdict, Verdict::Met | Verdict::Missed) {
            let _ = writeln!(
                md,
                "- ({}) {}: {} ({}{}).",
                row.metric.scenario,
                row.metric.label,
                if row.verdict == Verdict::Met {
                    "target met"
                } else {
                    "**target missed**"
                },
                fmt_target(row),
                match (row.metric.target, row.ratio, row.neutral, row.ours) {
                    (Target::OursBelow(_), _, _, Some(v)) => {
                        format!("; ours measured {} {}", fmt_value(Some(v)), row.metric.unit)
                    }
                    (_, Some(r), _, _) => format!("; measured ratio {}", fmt_value(Some(r))),
                    (_, None, Some(v), _) => format!("; measured {}", fmt_value(Some(v))),
                    _ => String::new(),
                }
            );
        }
    }
    if !missed.is_empty() {
        let _ = writeln!(
            md,
            "\n{} target(s) missed; the analysis below says why, as far as it is known.",
            missed.len()
        );
    }
    for (scenario, reason) in &results.unavailable {
        let _ = writeln!(md, "- ({scenario}) not run: {reason}");
    }

    md.push_str("\n## Analysis\n\n");
    md.push_str(NOTES_BEGIN);
    md.push('\n');
    md.push_str(notes.unwrap_or("(No analysis written yet.)"));
    md.push('\n');
    md.push_str(NOTES_END);
    md.push('\n');

    if !ctx.plots.is_empty() || ctx.plot_error.is_some() {
        md.push_str("\n## Plots\n\n");
        if let Some(error) = ctx.plot_error {
            let _ = writeln!(md, "Plots could not be drawn: {error}\n");
        }
        for (file, caption) in ctx.plots {
            let _ = writeln!(md, "**{caption}**\n\n![{caption}](benchmarks/{file})\n");
        }
    }

    for (scenario, title) in [
        ("e", "default QPS"),
        ("e_fast", "QPS 500 / burst 1000"),
        ("i", "data sources (i), QPS 500 / burst 1000"),
        ("j", "node mode (j), while provisioning, default QPS"),
    ] {
        let table = requests_table(&results.requests, scenario);
        if !table.is_empty() {
            let _ = writeln!(
                md,
                "\n## API requests per volume, {title} (apiserver side, all clients)\n\n\
                 Counted from `apiserver_request_total` between the phases' start and the moment \
                 the apiserver saw no more writes; includes the controller manager's binding \
                 work and the benchmark client's own create (and delete, in (e)) of each claim \
                 (one write each). Leases and watches are left out.\n\n{table}"
            );
        }
    }

    md.push_str("\n## Method\n\n");
    for (what, how) in ctx.method {
        let _ = writeln!(md, "- **{what}**: {how}");
    }
    md.push_str("\n## Machine and versions\n\n");
    for (what, value) in ctx.machine {
        let _ = writeln!(md, "- {what}: {value}");
    }
    md.push_str("\n## Runs\n\n| scenario | sidecar | round | wall time (s) | load at start | outcome |\n|---|---|--:|--:|--:|---|\n");
    for run in &results.runs {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} | {:.2} | {} |",
            run.scenario,
            run.imp.map_or("–", Impl::name),
            run.round,
            run.wall_secs,
            run.load,
            run.error.as_deref().map_or_else(
                || "ok".to_owned(),
                |e| format!("failed: {}", e.replace('\n', " ").replace('|', "\\|"))
            )
        );
    }
    md.push_str("\nRaw data: [samples](benchmarks/samples.csv), [curves](benchmarks/curves.csv), [requests](benchmarks/requests.csv), [runs](benchmarks/runs.csv), [(d) per size](benchmarks/d-scale.csv).\n");
    md
}

pub fn write_csvs(results: &Results, dir: &Path) -> Result<(), BenchError> {
    let imp = |i: Option<Impl>| i.map_or("", Impl::name);
    let mut samples = String::from("metric,impl,round,value\n");
    for s in &results.samples {
        let _ = writeln!(
            samples,
            "{},{},{},{}",
            s.metric,
            imp(s.imp),
            s.round,
            s.value
        );
    }
    let mut curves = String::from("curve,impl,round,t,value\n");
    for c in &results.curves {
        for (t, v) in &c.points {
            let _ = writeln!(curves, "{},{},{},{t:.3},{v}", c.name, c.imp, c.round);
        }
    }
    let mut requests =
        String::from("scenario,impl,round,phase,verb,resource,subresource,per_volume\n");
    for r in &results.requests {
        let _ = writeln!(
            requests,
            "{},{},{},{},{},{},{},{}",
            r.scenario, r.imp, r.round, r.phase, r.verb, r.resource, r.subresource, r.per_volume
        );
    }
    let mut runs = String::from("scenario,impl,round,wall_secs,load,error\n");
    for r in &results.runs {
        let _ = writeln!(
            runs,
            "{},{},{},{:.1},{:.2},{}",
            r.scenario,
            imp(r.imp),
            r.round,
            r.wall_secs,
            r.load,
            r.error.as_deref().unwrap_or("").replace(['\n', ','], " ")
        );
    }
    for (name, text) in [
        ("d-scale.csv", scale_csv(&results.samples)),
        ("samples.csv", samples),
        ("curves.csv", curves),
        ("requests.csv", requests),
        ("runs.csv", runs),
    ] {
        write(&dir.join(name), &text)?;
    }
    Ok(())
}

/// (d)'s figures, one line per size, sidecar and round (the setup time is the size's).
fn scale_csv(samples: &[Sample]) -> String {
    let columns = [
        stats::D_STEADY_RSS,
        stats::D_PEAK_RSS,
        stats::D_CPU,
        stats::D_FIRST,
        stats::D_SETTLE,
    ];
    let value = |id: &str, imp: Option<Impl>, round: Option<u32>| {
        samples
            .iter()
            .find(|s| s.metric == id && s.imp == imp && round.is_none_or(|r| s.round == r))
            .map_or(String::new(), |s| s.value.to_string())
    };
    let mut csv = String::from(
        "pairs,sidecar,round,steady_rss_mib,peak_rss_mib,startup_cpu_s,first_provision_s,settle_s,setup_s\n",
    );
    for &pairs in stats::D_QUICK.iter().chain(&stats::D_FULL) {
        let steady = stats::scale_metric(stats::D_STEADY_RSS, pairs).id;
        let setup = value(stats::scale_metric(stats::D_SETUP, pairs).id, None, None);
        for imp in Impl::BOTH {
            let mut rounds: Vec<u32> = samples
                .iter()
                .filter(|s| s.metric == steady && s.imp == Some(imp))
                .map(|s| s.round)
                .collect();
            rounds.sort_unstable();
            rounds.dedup();
            for round in rounds {
                let figures: Vec<String> = columns
                    .iter()
                    .map(|&base| value(stats::scale_metric(base, pairs).id, Some(imp), Some(round)))
                    .collect();
                let _ = writeln!(csv, "{pairs},{imp},{round},{},{setup}", figures.join(","));
            }
        }
    }
    csv
}

pub fn write(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|source| BenchError::Io {
        what: format!("writing {}", path.display()),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_survive_regeneration() {
        let old = format!("# x\n{NOTES_BEGIN}\nwe are slow because X\n{NOTES_END}\nrest");
        assert_eq!(kept_notes(&old), Some("we are slow because X"));
        assert_eq!(kept_notes("no markers"), None);
        let results = Results::default();
        let ctx = Context {
            command: "bench",
            generated: "now",
            total_secs: 60.0,
            machine: &[],
            method: &[],
            rounds: 1,
            plots: &[],
            plot_error: None,
        };
        let md = markdown(&results, &ctx, kept_notes(&old));
        assert_eq!(kept_notes(&md), Some("we are slow because X"));
    }

    #[test]
    fn table_shows_medians_ratio_and_verdict() {
        let mut results = Results::default();
        results.sample(stats::BC_CPU, Some(Impl::Ours), 1, 30.0);
        results.sample(stats::BC_CPU, Some(Impl::Upstream), 1, 40.0);
        let text = table(&stats::summarize(&results.samples));
        let line = text
            .lines()
            .find(|l| l.starts_with("b "))
            .expect("row for b");
        assert!(line.contains("30.0") && line.contains("40.0") && line.contains("0.75"));
        assert!(line.contains("MISSED"), "{line}");
    }

    #[test]
    fn scale_csv_has_a_line_per_size_sidecar_and_round() {
        let mut results = Results::default();
        let steady = stats::scale_metric(stats::D_STEADY_RSS, 10_000);
        results.sample(steady, Some(Impl::Ours), 1, 20.0);
        results.sample(steady, Some(Impl::Ours), 2, 22.0);
        results.sample(
            stats::scale_metric(stats::D_FIRST, 10_000),
            Some(Impl::Ours),
            2,
            1.5,
        );
        results.sample(stats::scale_metric(stats::D_SETUP, 10_000), None, 1, 60.0);
        let csv = scale_csv(&results.samples);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3, "{csv}");
        assert_eq!(lines[1], "10000,ours,1,20,,,,,60");
        assert_eq!(lines[2], "10000,ours,2,22,,,1.5,,60");
    }

    #[test]
    fn request_table_counts_missing_keys_as_zero() {
        let row = |imp, round, verb: &str, per_volume| RequestRow {
            scenario: "e",
            imp,
            round,
            phase: "provision",
            verb: verb.into(),
            resource: "persistentvolumeclaims".into(),
            subresource: String::new(),
            per_volume,
        };
        let rows = vec![
            row(Impl::Ours, 1, "GET", 1.0),
            row(Impl::Ours, 2, "POST", 1.0),
            row(Impl::Upstream, 1, "POST", 1.0),
        ];
        let table = requests_table(&rows, "e");
        let get = table
            .lines()
            .find(|l| l.contains("| GET |"))
            .expect("GET row");
        // Ours: 1 and 0 over two rounds → 0.50; upstream's one round made none.
        assert!(get.contains("| 0.50 | 0.00 |"), "{get}");
    }
}
