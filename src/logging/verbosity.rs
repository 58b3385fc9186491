//! Which log lines `-v` and `--vmodule` let through: klog's verbosity levels mapped to
//! tracing levels per crate.
//!
//! | `-v`  | enabled |
//! |-------|---------|
//! | ≤ 0   | `info` everywhere |
//! | 1–3   | as 0, and this crate at `debug` (decisions, retries, state changes) |
//! | 4     | as 1–3, and `kube_client` at `debug`: one line per API request and response status |
//! | 5     | `debug` everywhere; this crate, `kube_client` and `kube_runtime` at `trace` (CSI request and response bodies, secrets redacted); the noisy transport crates (h2, hyper, hyper_util, rustls, tower) stay at `info` |
//! | ≥ 6   | `trace` everywhere |
//!
//! kube-runtime's `reconciling object` span, the context printed before a reconcile's lines,
//! is written from `-v=4` only: our lines name their claim or volume themselves, and the span,
//! created and formatted for every reconcile, cost 4 % of the sidecar's CPU at `-v=0`
//! (docs/benchmarks.md, "CPU per provision").
//!
//! `--vmodule=pattern=N,...` raises the level of the lines written from the source files whose
//! name without `.rs` (`claims` for src/controller/provisioning/claims.rs, `mod` for every
//! mod.rs) matches a glob pattern (`*`, `?`, `[a-z]`, `[^a]`, `\` escape), as klog does with Go
//! file names: for those lines the level is the larger of `-v` and N, and the first matching
//! pattern wins. A module path (`csi_provisioner::controller`) does not match: the pattern is a
//! file name.

use tracing::Metadata;
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing_subscriber::layer::{Context, Filter};

use crate::config::VModuleItem;

/// This crate's target and the client crates whose debug lines `-v=4` and `-v=5` add.
const OURS: &str = "csi_provisioner";
const KUBE_CLIENT: &str = "kube_client";
const KUBE_RUNTIME: &str = "kube_runtime";
/// From this `-v` on, kube-runtime's spans are written.
const KUBE_RUNTIME_SPANS: i32 = 4;
/// Transport crates kept at `info` at `-v=5`: their debug lines drown the rest.
const NOISY: [&str; 5] = ["h2", "hyper", "hyper_util", "rustls", "tower"];

/// The filter of `-v` and `--vmodule`.
#[derive(Debug, Clone)]
pub struct Verbosity {
    level: i32,
    /// The `--vmodule` items with a level above 0 (klog drops the others).
    vmodule: Vec<VModuleItem>,
}

impl Verbosity {
    pub fn new(level: i32, vmodule: &[VModuleItem]) -> Self {
        let vmodule = vmodule.iter().filter(|i| i.level > 0).cloned().collect();
        Self { level, vmodule }
    }

    /// Whether a line (or span) with this metadata is written.
    pub fn enables(&self, meta: &Metadata<'_>) -> bool {
        let level = self.level_of_file(meta.file());
        if meta.is_span() && in_crate(meta.target(), KUBE_RUNTIME) && level < KUBE_RUNTIME_SPANS {
            return false;
        }
        *meta.level() <= max_level(level, meta.target())
    }

    /// `-v`, raised by the first `--vmodule` pattern that matches the file name.
    fn level_of_file(&self, file: Option<&str>) -> i32 {
        let Some(name) = file.map(file_name) else {
            return self.level;
        };
        self.vmodule
            .iter()
            .find(|item| glob_match(item.pattern.as_bytes(), name.as_bytes()))
            .map_or(self.level, |item| {
                self.level
                    .max(i32::try_from(item.level).unwrap_or(i32::MAX))
            })
    }

    /// The most verbose level anything may be written at.
    fn hint(&self) -> LevelFilter {
        let most = self.vmodule.iter().map(|i| i.level).max().unwrap_or(0);
        let most = self.level.max(i32::try_from(most).unwrap_or(i32::MAX));
        match most {
            i32::MIN..=0 => LevelFilter::INFO,
            1..=4 => LevelFilter::DEBUG,
            _ => LevelFilter::TRACE,
        }
    }
}

/// The most verbose tracing level written for `target` at klog level `v` (table above).
pub fn max_level(v: i32, target: &str) -> LevelFilter {
    let is = |krate: &str| in_crate(target, krate);
    match v {
        i32::MIN..=0 => LevelFilter::INFO,
        1..=3 if is(OURS) => LevelFilter::DEBUG,
        4 if is(OURS) || is(KUBE_CLIENT) => LevelFilter::DEBUG,
        1..=4 => LevelFilter::INFO,
        5 if is(OURS) || is(KUBE_CLIENT) || is(KUBE_RUNTIME) => LevelFilter::TRACE,
        5 if NOISY.iter().any(|n| is(n)) => LevelFilter::INFO,
        5 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// Whether `target` is `krate` or one of its modules.
fn in_crate(target: &str, krate: &str) -> bool {
    target
        .strip_prefix(krate)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
}

/// The file name without directory and `.rs`, what a `--vmodule` pattern is matched against.
fn file_name(path: &str) -> &str {
    let base = path.rsplit(['/', '\\']).next().unwrap_or(path);
    base.strip_suffix(".rs").unwrap_or(base)
}

/// Go's `filepath.Match` on a name without separators: `*` any run, `?` one character,
/// `[...]` a class with ranges and `^` negation, `\` escapes. A malformed class never matches.
fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|skip| glob_match(rest, &name[skip..])),
        Some((b'?', rest)) => !name.is_empty() && glob_match(rest, &name[1..]),
        Some((b'[', rest)) => match (name.split_first(), class_match(rest, name.first())) {
            (Some((_, name_rest)), Some((true, after))) => glob_match(after, name_rest),
            _ => false,
        },
        Some((b'\\', rest)) => match (rest.split_first(), name.split_first()) {
            (Some((p, rest)), Some((c, name_rest))) => p == c && glob_match(rest, name_rest),
            _ => false,
        },
        Some((p, rest)) => name.first() == Some(p) && glob_match(rest, &name[1..]),
    }
}

/// Matches `c` against the class whose text follows `[`; returns whether it matched and the
/// pattern after `]`, or `None` when the class is malformed or there is no character.
fn class_match<'p>(class: &'p [u8], c: Option<&u8>) -> Option<(bool, &'p [u8])> {
    let c = *c?;
    let (negated, mut rest) = match class.split_first() {
        Some((b'^', rest)) => (true, rest),
        _ => (false, class),
    };
    let mut matched = false;
    let mut first = true;
    loop {
        match rest.split_first() {
            Some((b']', after)) if !first => return Some((matched != negated, after)),
            None => return None,
            _ => {}
        }
        first = false;
        let (lo, after) = class_char(rest)?;
        let (hi, after) = match after.split_first() {
            Some((b'-', range)) => class_char(range)?,
            _ => (lo, after),
        };
        matched |= lo <= c && c <= hi;
        rest = after;
    }
}

/// One character of a class, `\` escapes included; an unescaped `]` or `-` there is malformed,
/// as in Go.
fn class_char(text: &[u8]) -> Option<(u8, &[u8])> {
    match text.split_first()? {
        (b'\\', rest) => rest.split_first().map(|(c, r)| (*c, r)),
        (b']' | b'-', _) => None,
        (c, rest) => Some((*c, rest)),
    }
}

/// The decision depends on the metadata alone, so each callsite is judged once.
impl<S> Filter<S> for Verbosity {
    fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        self.enables(meta)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if self.enables(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.hint())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(pattern: &str, level: u32) -> VModuleItem {
        VModuleItem {
            pattern: pattern.into(),
            level,
        }
    }

    #[test]
    fn levels_follow_the_table() {
        use LevelFilter as L;
        let ours = "csi_provisioner::controller::claim";
        for (v, target, expected) in [
            (-1, ours, L::INFO),
            (0, ours, L::INFO),
            (0, "kube_client::client", L::INFO),
            (1, ours, L::DEBUG),
            (3, ours, L::DEBUG),
            (3, "kube_client", L::INFO),
            (3, "csi_provisioner_x", L::INFO),
            (4, ours, L::DEBUG),
            (4, "kube_client::client::builder", L::DEBUG),
            (4, "kube_runtime", L::INFO),
            (5, ours, L::TRACE),
            (5, "kube_runtime::watcher", L::TRACE),
            (5, "h2::codec", L::INFO),
            (5, "hyper_util", L::INFO),
            (5, "tonic::transport", L::DEBUG),
            (6, "h2", L::TRACE),
            (9, "anything", L::TRACE),
        ] {
            assert_eq!(max_level(v, target), expected, "-v={v} {target}");
        }
    }

    #[test]
    fn file_names_are_matched_without_directory_and_extension() {
        assert_eq!(file_name("src/controller/claim.rs"), "claim");
        assert_eq!(
            file_name("/root/.cargo/registry/src/kube-client/src/client/mod.rs"),
            "mod"
        );
        assert_eq!(file_name("C:\\src\\leader.rs"), "leader");
        assert_eq!(file_name("claim"), "claim");
    }

    #[test]
    fn globs_follow_go_filepath_match() {
        for (pattern, name, matches) in [
            ("claim", "claim", true),
            ("claim", "claims", false),
            ("cla*", "claim", true),
            ("*", "", true),
            ("*im", "claim", true),
            ("c?aim", "claim", true),
            ("c?aim", "caim", false),
            ("[a-c]laim", "claim", true),
            ("[^a-c]laim", "claim", false),
            ("[^a-c]laim", "flaim", true),
            ("[]a]x", "]x", false),
            ("[-a]x", "ax", false),
            ("\\*x", "*x", true),
            ("\\*x", "ax", false),
            ("[a-", "a", false),
            ("controller::claim", "claim", false),
            ("csi_provisioner::controller", "mod", false),
        ] {
            assert_eq!(
                glob_match(pattern.as_bytes(), name.as_bytes()),
                matches,
                "{pattern:?} ~ {name:?}"
            );
        }
    }

    #[test]
    fn vmodule_raises_the_level_of_matching_files_only() {
        let v = Verbosity::new(0, &[item("zero", 0), item("cl*", 5), item("claim", 1)]);
        assert_eq!(
            v.level_of_file(Some("src/controller/claim.rs")),
            5,
            "first match wins"
        );
        assert_eq!(v.level_of_file(Some("src/controller/volume.rs")), 0);
        assert_eq!(v.level_of_file(None), 0);
        // A pattern at level 0 is dropped, as klog does, so it shadows nothing.
        let v = Verbosity::new(0, &[item("claim", 0), item("cl*", 3)]);
        assert_eq!(v.level_of_file(Some("src/claim.rs")), 3);
        // It never lowers -v.
        let v = Verbosity::new(4, &[item("claim", 2)]);
        assert_eq!(v.level_of_file(Some("src/claim.rs")), 4);
        assert_eq!(Verbosity::new(0, &[]).hint(), LevelFilter::INFO);
        assert_eq!(
            Verbosity::new(0, &[item("claim", 5)]).hint(),
            LevelFilter::TRACE
        );
        assert_eq!(
            Verbosity::new(2, &[item("claim", 0)]).hint(),
            LevelFilter::DEBUG
        );
    }

    /// A callsite of kube-runtime's, built by hand: a test that went through a subscriber
    /// would see the interest other tests' subscribers cached for the same callsite.
    struct KubeRuntime;
    impl tracing::callsite::Callsite for KubeRuntime {
        fn set_interest(&self, _: Interest) {}
        fn metadata(&self) -> &Metadata<'_> {
            &RECONCILING
        }
    }
    static KUBE_RUNTIME_CALLSITE: KubeRuntime = KubeRuntime;
    const fn kube_runtime_metadata(kind: tracing::metadata::Kind) -> Metadata<'static> {
        Metadata::new(
            "reconciling object",
            "kube_runtime::controller",
            tracing::Level::INFO,
            Some("src/controller/mod.rs"),
            None,
            None,
            tracing::field::FieldSet::new(
                &[],
                tracing::callsite::Identifier(&KUBE_RUNTIME_CALLSITE),
            ),
            kind,
        )
    }
    static RECONCILING: Metadata<'static> = kube_runtime_metadata(tracing::metadata::Kind::SPAN);
    static KUBE_RUNTIME_LINE: Metadata<'static> =
        kube_runtime_metadata(tracing::metadata::Kind::EVENT);

    #[test]
    fn kube_runtime_spans_are_written_from_v4_only() {
        for (v, written) in [(0, false), (3, false), (4, true), (6, true)] {
            let verbosity = Verbosity::new(v, &[]);
            assert_eq!(verbosity.enables(&RECONCILING), written, "-v={v}");
            assert!(
                verbosity.enables(&KUBE_RUNTIME_LINE),
                "-v={v}: its lines stay"
            );
        }
        // --vmodule raises the level of the span's file like any line's.
        assert!(Verbosity::new(0, &[item("mod", 4)]).enables(&RECONCILING));
    }
}
