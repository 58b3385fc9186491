//! API request counts (pure): the apiserver's `apiserver_request_total` counts every client
//! alike, by verb and resource but not by client; the controller manager's
//! `rest_client_requests_total` counts its own requests by HTTP method. The sidecar's share of
//! the writes is the apiserver's count minus the controller manager's minus the benchmark
//! client's own, which it counts itself.

use std::collections::BTreeMap;

/// `(verb, resource, subresource)` as the apiserver labels them (verbs are upper case:
/// GET, LIST, WATCH, POST, PUT, PATCH, APPLY, DELETE, DELETECOLLECTION).
pub type RequestKey = (String, String, String);

/// Counts of `apiserver_request_total`, summed over codes, groups, versions and scopes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApiCounts(pub BTreeMap<RequestKey, f64>);

/// Counts of a client's `rest_client_requests_total`, summed over codes and hosts, by method.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClientCounts(pub BTreeMap<String, f64>);

/// Writes a sidecar makes without leader election never touch Leases; the apiserver renews its
/// own identity Leases every few seconds through its loopback client, so Leases are left out.
const NOT_THE_SIDECARS: &str = "leases";

pub fn parse_apiserver(text: &str) -> ApiCounts {
    let mut counts = BTreeMap::new();
    for (labels, value) in samples(text, "apiserver_request_total") {
        let key = (
            labels.get("verb").cloned().unwrap_or_default(),
            labels.get("resource").cloned().unwrap_or_default(),
            labels.get("subresource").cloned().unwrap_or_default(),
        );
        *counts.entry(key).or_insert(0.0) += value;
    }
    ApiCounts(counts)
}

pub fn parse_client(text: &str) -> ClientCounts {
    let mut counts = BTreeMap::new();
    for (labels, value) in samples(text, "rest_client_requests_total") {
        let method = labels.get("method").cloned().unwrap_or_default();
        *counts.entry(method).or_insert(0.0) += value;
    }
    ClientCounts(counts)
}

/// `(labels, value)` of every sample of `name` (exactly that name, not `name_bucket` etc.).
fn samples<'a>(
    text: &'a str,
    name: &'a str,
) -> impl Iterator<Item = (BTreeMap<String, String>, f64)> + 'a {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        let (labels, value) = if let Some(rest) = rest.strip_prefix('{') {
            let end = rest.rfind('}')?;
            (parse_labels(&rest[..end]), &rest[end + 1..])
        } else if rest.starts_with(' ') {
            (BTreeMap::new(), rest)
        } else {
            return None;
        };
        let value: f64 = value.split_whitespace().next()?.parse().ok()?;
        Some((labels, value))
    })
}

/// `a="x",b="y\"z"` → {a: x, b: y"z}.
fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        let name: String = chars
            .by_ref()
            .skip_while(|c| *c == ',' || c.is_whitespace())
            .take_while(|c| *c != '=')
            .collect();
        if name.is_empty() || chars.next() != Some('"') {
            break;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(name.trim().to_owned(), value);
    }
    labels
}

impl ApiCounts {
    /// `self - before`, keeping only keys that changed.
    pub fn since(&self, before: &ApiCounts) -> ApiCounts {
        ApiCounts(
            self.0
                .iter()
                .filter_map(|(key, after)| {
                    let delta = after - before.0.get(key).copied().unwrap_or(0.0);
                    (delta != 0.0).then(|| (key.clone(), delta))
                })
                .collect(),
        )
    }

    /// Writes on API resources, Leases excepted (see [`NOT_THE_SIDECARS`]).
    pub fn writes(&self) -> f64 {
        self.sum(|verb, resource, _| {
            is_write(verb) && !resource.is_empty() && resource != NOT_THE_SIDECARS
        })
    }

    /// Writes on claims and PVs (status included).
    pub fn volume_writes(&self) -> f64 {
        self.volume_writes_by_request().values().sum()
    }

    /// [`ApiCounts::volume_writes`] by `VERB resource[/subresource]`.
    pub fn volume_writes_by_request(&self) -> BTreeMap<String, f64> {
        self.0
            .iter()
            .filter(|((verb, resource, _), _)| {
                is_write(verb)
                    && matches!(
                        resource.as_str(),
                        "persistentvolumes" | "persistentvolumeclaims"
                    )
            })
            .map(|((verb, resource, sub), n)| {
                let request = if sub.is_empty() {
                    format!("{verb} {resource}")
                } else {
                    format!("{verb} {resource}/{sub}")
                };
                (request, *n)
            })
            .collect()
    }

    /// Single-object reads (GET) on API resources; lists and watches are not per-volume costs.
    pub fn gets(&self) -> f64 {
        self.sum(|verb, resource, _| verb == "GET" && !resource.is_empty())
    }

    /// Every request on API resources but watches (counted when they end, not when they start)
    /// and Leases.
    pub fn all(&self) -> f64 {
        self.sum(|verb, resource, _| {
            verb != "WATCH" && !resource.is_empty() && resource != NOT_THE_SIDECARS
        })
    }

    fn sum(&self, keep: impl Fn(&str, &str, &str) -> bool) -> f64 {
        self.0
            .iter()
            .filter(|((verb, resource, sub), _)| keep(verb, resource, sub))
            .map(|(_, v)| v)
            .sum()
    }
}

impl ClientCounts {
    pub fn since(&self, before: &ClientCounts) -> ClientCounts {
        ClientCounts(
            self.0
                .iter()
                .map(|(method, after)| {
                    let delta = after - before.0.get(method).copied().unwrap_or(0.0);
                    (method.clone(), delta)
                })
                .filter(|(_, delta)| *delta != 0.0)
                .collect(),
        )
    }

    pub fn writes(&self) -> f64 {
        self.0
            .iter()
            .filter(|(method, _)| write_method(method).is_some())
            .map(|(_, v)| v)
            .sum()
    }
}

fn is_write(verb: &str) -> bool {
    write_method(verb).is_some()
}

fn write_method(verb: &str) -> Option<&'static str> {
    match verb {
        "POST" | "CREATE" => Some("POST"),
        "PUT" | "UPDATE" => Some("PUT"),
        "PATCH" | "APPLY" => Some("PATCH"),
        "DELETE" | "DELETECOLLECTION" => Some("DELETE"),
        _ => None,
    }
}

/// The sidecar's writes in one phase: everything the apiserver counted, less the controller
/// manager's and the benchmark client's own. Never negative (the counts are read a moment
/// apart, so the controller manager's can run slightly ahead).
pub fn sidecar_writes(apiserver: &ApiCounts, kcm: &ClientCounts, bench_writes: f64) -> f64 {
    (apiserver.writes() - kcm.writes() - bench_writes).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const APISERVER: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="cluster",subresource="",verb="POST",version="v1"} 10
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="cluster",subresource="",verb="POST",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="resource",subresource="status",verb="PUT",version="v1"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="resource",subresource="",verb="GET",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="events",scope="resource",subresource="",verb="APPLY",version="v1"} 1
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="/healthz",verb="GET",version=""} 4
apiserver_request_total_other{verb="POST",resource="persistentvolumes"} 99
apiserver_request_duration_seconds_bucket{verb="POST",le="1"} 1
"#;

    #[test]
    fn apiserver_counts_sum_over_codes() {
        let counts = parse_apiserver(APISERVER);
        let pv_post = ("POST".into(), "persistentvolumes".into(), String::new());
        assert_eq!(counts.0.get(&pv_post), Some(&12.0));
        // PV POSTs + PVC status PUT + event APPLY; Leases and non-resource URLs are not ours.
        assert_eq!(counts.writes(), 18.0);
        assert_eq!(counts.gets(), 3.0);
        assert_eq!(counts.all(), 21.0);
    }

    #[test]
    fn deltas_keep_what_changed() {
        let before = parse_apiserver(APISERVER);
        let after = parse_apiserver(&APISERVER.replace("} 10\n", "} 25\n"));
        let delta = after.since(&before);
        assert_eq!(delta.0.len(), 1);
        assert_eq!(delta.writes(), 15.0);
    }

    #[test]
    fn client_counts_by_method() {
        let text = r#"rest_client_requests_total{code="200",host="127.0.0.1:6443",method="GET"} 64
rest_client_requests_total{code="201",host="127.0.0.1:6443",method="POST"} 3
rest_client_requests_total{code="409",host="127.0.0.1:6443",method="POST"} 1
rest_client_requests_total{code="200",host="127.0.0.1:6443",method="PUT"} 5
"#;
        let before = parse_client(text);
        assert_eq!(before.writes(), 9.0);
        let after = parse_client(&text.replace("} 5\n", "} 8\n"));
        assert_eq!(after.since(&before).writes(), 3.0);
    }

    #[test]
    fn sidecar_share_subtracts_the_others_and_never_goes_negative() {
        let counts = parse_apiserver(APISERVER);
        let kcm = ClientCounts(BTreeMap::from([("PUT".to_owned(), 5.0)]));
        assert_eq!(sidecar_writes(&counts, &kcm, 10.0), 3.0);
        assert_eq!(sidecar_writes(&counts, &kcm, 100.0), 0.0);
    }

    #[test]
    fn label_values_may_hold_escapes_and_commas() {
        let labels = parse_labels(r#"a="x,y",b="say \"hi\"",c="""#);
        assert_eq!(labels.get("a").map(String::as_str), Some("x,y"));
        assert_eq!(labels.get("b").map(String::as_str), Some("say \"hi\""));
        assert_eq!(labels.get("c").map(String::as_str), Some(""));
    }
}
