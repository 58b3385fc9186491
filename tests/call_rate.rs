//! Ours: a StorageClass's calls per second (`provisioner.csi-rs.dev/calls-per-second`) and
//! `--adaptive-call-rate`, with the reference driver over its socket. The rate is measured
//! where the backend sees it: the arrival times of the driver's CreateVolume and DeleteVolume
//! requests (its debug log, stamped as they arrive).

use csi_test_support as support;

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use support::cluster::{CLASS_QUEUED_METRIC, Cluster, wait_bound};
use support::peers::{Driver, Sidecar, SidecarOptions, TIMEOUT, metric_sum, parse_metrics};

const RATE_METRIC: &str = "csi_provisioner_storage_class_calls_per_second";
const QUEUED_METRIC: &str = CLASS_QUEUED_METRIC;
const FAST_RETRIES: [&str; 2] = ["--retry-interval-start=200ms", "--retry-interval-max=1s"];

/// Calls per second between the first and the last arrival: (n - 1) gaps over the time they
/// took. Printed only: how fast a loaded machine keeps up is a benchmark's figure, not a test's.
fn rate_of(arrivals: &[Timestamp]) -> f64 {
    let (Some(first), Some(last)) = (arrivals.first(), arrivals.last()) else {
        return 0.0;
    };
    let seconds = last.duration_since(*first).as_secs_f64();
    (arrivals.len() - 1) as f64 / seconds
}

/// How late the driver may stamp a call's arrival without the sidecar having gone faster: the
/// limiter spaces the starts of calls, and a stalled socket or driver process on a loaded
/// machine delivers calls late and then together, which shortens the gaps the driver sees.
const DELIVERY_JITTER: f64 = 1.0;

/// The bound the limiter controls, never faster than `rate`: in every window between two
/// arrivals, at most `rate × (window + DELIVERY_JITTER)` calls beyond the first. A limiter that
/// let 20 calls through at once fails it. The first window that breaks it, if any.
fn faster_than(rate: f64, arrivals: &[Timestamp]) -> Option<String> {
    let mut sorted = arrivals.to_vec();
    sorted.sort();
    for (i, first) in sorted.iter().enumerate() {
        for (j, last) in sorted.iter().enumerate().skip(i + 1) {
            let window = last.duration_since(*first).as_secs_f64();
            let calls = (j - i) as f64;
            let allowed = rate * (window + DELIVERY_JITTER);
            if calls > allowed {
                return Some(format!(
                    "{calls} calls in {window:.3} s after the one at {first} (at most {allowed:.1})"
                ));
            }
        }
    }
    None
}

/// The value of `name` for `class` on the sidecar's metrics page, if the series exists.
fn class_gauge(sidecar: &Sidecar, name: &str, class: &str) -> Result<Option<f64>, String> {
    let samples = parse_metrics(&sidecar.metrics()?);
    let present = samples.iter().any(|sample| {
        sample.name == name && sample.labels.get("storage_class").map(String::as_str) == Some(class)
    });
    Ok(present.then(|| metric_sum(&samples, name, &[("storage_class", class)])))
}

#[tokio::test]
async fn calls_of_a_class_never_go_faster_than_its_rate() {
    const RATE: f64 = 4.0;
    const CLAIMS: usize = 20;
    let cluster = Cluster::new("rate").await;
    let driver = Driver::start(&[]).await;
    let mut sidecar = Sidecar::start_with(
        &driver,
        SidecarOptions {
            metrics: true,
            ..SidecarOptions::args(&FAST_RETRIES)
        },
    );
    let class = cluster.class("rate", &driver, "Delete", &[]).await;
    cluster.set_class_rate(&class, "4").await;
    let names = cluster.claims_named("held", &class, CLAIMS).await;
    for name in &names {
        wait_bound(&cluster.claims, name).await;
    }
    let creates: Vec<Timestamp> = driver
        .requests("CreateVolume")
        .iter()
        .filter_map(|line| line.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(creates.len(), CLAIMS, "one CreateVolume per claim");
    let create_rate = rate_of(&creates);
    assert_eq!(
        class_gauge(&sidecar, RATE_METRIC, &class).unwrap(),
        Some(RATE),
        "the gauge shows the class's rate"
    );
    assert!(
        class_gauge(&sidecar, QUEUED_METRIC, &class)
            .unwrap()
            .is_some(),
        "the class's queue has a series"
    );

    for name in &names {
        cluster.delete_claim(name).await;
    }
    support::eventually("every volume deleted", TIMEOUT, || async {
        match driver.volume_count() {
            0 => Ok(()),
            left => Err(format!("{left} volumes left")),
        }
    })
    .await;
    let deletes: Vec<Timestamp> = driver
        .volume_requests("DeleteVolume")
        .into_iter()
        .map(|request| request.at)
        .collect();
    assert_eq!(deletes.len(), CLAIMS, "one DeleteVolume per volume");
    let delete_rate = rate_of(&deletes);
    println!(
        "calls per second at a setting of {RATE}: CreateVolume {create_rate:.3}, DeleteVolume {delete_rate:.3}"
    );
    for (what, arrivals) in [("CreateVolume", &creates), ("DeleteVolume", &deletes)] {
        if let Some(burst) = faster_than(RATE, arrivals) {
            panic!("{what} went faster than {RATE} calls/s: {burst}");
        }
    }
    sidecar.assert_running();
}

#[tokio::test]
async fn an_overloaded_driver_slows_its_class_until_it_recovers() {
    let cluster = Cluster::new("adaptive").await;
    let driver = Driver::start(&[]).await;
    let mut args = FAST_RETRIES.to_vec();
    args.push("--adaptive-call-rate");
    let mut sidecar = Sidecar::start_with(
        &driver,
        SidecarOptions {
            metrics: true,
            ..SidecarOptions::args(&args)
        },
    );
    let class = cluster.class("adaptive", &driver, "Delete", &[]).await;
    cluster.set_class_rate(&class, "8").await;
    // The backend says it is overloaded, call after call: the class's rate is cut in half at
    // most once a second, each time.
    driver.set_faults("fault CreateVolume=before:unavailable");
    cluster.claim("pushed-back", &class).await;
    support::eventually(
        "the class's rate to be cut to 2 or less",
        TIMEOUT,
        || async {
            match class_gauge(&sidecar, RATE_METRIC, &class)? {
                Some(rate) if rate <= 2.0 => Ok(()),
                other => Err(format!("rate {other:?}")),
            }
        },
    )
    .await;
    let failed_calls = driver.calls("CreateVolume").len();
    // The backend keeps up again: the claim is provisioned and the rate climbs back to the
    // class's own, a step every 2 s.
    driver.clear_faults();
    wait_bound(&cluster.claims, "pushed-back").await;
    support::eventually("the class's rate to be back at 8", TIMEOUT, || async {
        match class_gauge(&sidecar, RATE_METRIC, &class)? {
            Some(8.0) => Ok(()),
            other => Err(format!("rate {other:?}")),
        }
    })
    .await;
    let codes: BTreeMap<String, usize> =
        driver
            .calls("CreateVolume")
            .into_iter()
            .fold(BTreeMap::new(), |mut codes, call| {
                *codes.entry(call.code).or_default() += 1;
                codes
            });
    assert_eq!(codes.get("Ok"), Some(&1), "{codes:?}");
    // A retry may still have been refused between the count above and the faults' removal.
    assert!(
        failed_calls >= 2 && codes.get("Unavailable").is_some_and(|n| *n >= failed_calls),
        "two cuts took {failed_calls} answers: {codes:?}"
    );
    sidecar.assert_running();
}
