//! `--node-deployment`: the claims of this node, and the race for an Immediate claim.

use super::*;

const NODE: &str = "node-b";
const NODE_KEY: &str = "example.com/node";

/// `--node-deployment` on node-b, whose driver's segment is `example.com/node=node-b`;
/// class `standard` as above, and class `now` with Immediate binding.
fn node_b() -> Cluster {
    cluster()
        .class(
            ClassBuilder::new()
                .name("now")
                .binding_mode("Immediate")
                .parameter("type", "fast")
                .build(),
        )
        .node_mode(NODE, &[(NODE_KEY, NODE)])
        .claim(immediate_claim().build())
}

fn node_b_segment() -> Vec<csi::Topology> {
    vec![csi::Topology {
        segments: strings(&[(NODE_KEY, NODE)]),
    }]
}

/// An Immediate claim (class `now`) no node owns yet.
fn immediate_claim() -> PvcBuilder {
    claim().class("now")
}

fn capacity_asked(available: i64) -> Step {
    let pvc = immediate_claim().build();
    let class = ClassBuilder::new()
        .name("now")
        .binding_mode("Immediate")
        .build();
    let caps = crate::provision::DriverCapabilities {
        topology: true,
        ..crate::provision::fixtures::caps()
    };
    let plan = crate::provision::plan_provision(
        &pvc,
        &class,
        &crate::provision::fixtures::config(),
        &caps,
        &[],
    )
    .expect("a plan");
    Step::GetCapacity {
        expected: csi::GetCapacityRequest {
            volume_capabilities: plan.volume_capabilities,
            parameters: strings(&[("type", "fast")]),
            accessible_topology: node_b_segment().pop(),
        },
        answer: Ok(csi::GetCapacityResponse {
            available_capacity: available,
            ..Default::default()
        }),
    }
}

fn node_selected(status: u16) -> Step {
    let call = patch(CLAIM_PATH).body(json!({"metadata": {
        "resourceVersion": "7",
        "annotations": {"volume.kubernetes.io/selected-node": NODE},
    }}));
    if status == 200 {
        call.answer(
            200,
            immediate_claim()
                .annotation(ANN_SELECTED_NODE, NODE)
                .build(),
        )
    } else {
        call.refuse(status, "Conflict")
    }
}

/// The wait of a retry, within `range`.
fn waits(next: &Next, range: std::ops::RangeInclusive<Duration>) -> Duration {
    let Next::RetryIn(wait) = *next else {
        panic!("{next:?} is not a retry")
    };
    assert!(range.contains(&wait), "{wait:?} not in {range:?}");
    wait
}

/// Just past `wait` (its decimal form may have lost a fraction of a nanosecond).
async fn sleep_past(wait: Duration) {
    tokio::time::advance(wait + Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_claim_selected_to_another_node_gets_no_request() {
    let scenario = node_b().start([]).await;
    assert_eq!(
        reconcile(&scenario, on_node("node-a").build()).await,
        Next::Wait
    );
    assert!(
        !scenario
            .claims()
            .has_work(&cached(&on_node("node-a").build()))
    );
    assert!(scenario.finish().await.is_empty(), "no event either");
}

#[tokio::test(start_paused = true)]
async fn a_claim_selected_to_this_node_is_created_on_its_segment() {
    let create = CreateVolumeCall {
        accessibility: Some(csi::TopologyRequirement {
            requisite: node_b_segment(),
            preferred: node_b_segment(),
        }),
        ..expected_create()
    };
    let mut answer = created("vol-1", GIB);
    if let Ok(Some(volume)) = answer.as_mut().map(|r| r.volume.as_mut()) {
        volume.accessible_topology = node_b_segment();
    }
    let scenario = node_b()
        .start([
            // No other node holds an operation for the volume.
            every_node_journal(&[]),
            secret_read(),
            record_written(),
            create_volume(create, answer),
            pv_created(),
            record_removed(),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, on_node(NODE).build()).await,
        Next::Wait
    );
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

#[tokio::test(start_paused = true)]
async fn an_immediate_claim_is_taken_after_the_delay_and_a_capacity_check() {
    let scenario = node_b()
        .start([capacity_asked(GIB), node_selected(200)])
        .await;
    let first = reconcile(&scenario, immediate_claim().build()).await;
    let wait = waits(&first, Duration::ZERO..=Duration::from_secs(1));
    // Woken early (an update of the claim): the rest of the wait, nothing sent.
    let early = reconcile(&scenario, immediate_claim().build()).await;
    waits(&early, Duration::ZERO..=wait);
    sleep_past(wait).await;
    assert_eq!(
        reconcile(&scenario, immediate_claim().build()).await,
        Next::Wait
    );
    assert!(scenario.finish().await.is_empty(), "no event for a race");
}

#[tokio::test(start_paused = true)]
async fn a_lost_write_or_no_room_waits_longer_and_another_nodes_name_ends_the_race() {
    let scenario = node_b()
        .start([
            capacity_asked(GIB - 1),
            capacity_asked(GIB),
            node_selected(409),
        ])
        .await;
    let wait = waits(
        &reconcile(&scenario, immediate_claim().build()).await,
        Duration::ZERO..=Duration::from_secs(1),
    );
    sleep_past(wait).await;
    // No room here: the second wait is (1, 2] s.
    let wait = waits(
        &reconcile(&scenario, immediate_claim().build()).await,
        Duration::from_millis(1001)..=Duration::from_secs(2),
    );
    sleep_past(wait).await;
    // Room, but another node wrote first: capped at 2 s, less up to 1 s of jitter.
    let wait = waits(
        &reconcile(&scenario, immediate_claim().build()).await,
        Duration::from_millis(1001)..=Duration::from_secs(2),
    );
    assert_eq!(scenario.claims().races().attempts(PVC_UID), Some(3));
    sleep_past(wait).await;
    // The winner's name is in the cache now: nothing is sent and the race is over.
    let taken = immediate_claim()
        .annotation(ANN_SELECTED_NODE, "node-a")
        .build();
    assert_eq!(reconcile(&scenario, taken).await, Next::Wait);
    assert_eq!(scenario.claims().races().attempts(PVC_UID), None);
    assert!(scenario.finish().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_driver_without_topology_is_asked_for_capacity_without_a_segment() {
    let pvc = immediate_claim().build();
    let Step::GetCapacity {
        mut expected,
        answer,
    } = capacity_asked(GIB)
    else {
        unreachable!()
    };
    expected.accessible_topology = None;
    let scenario = cluster()
        .class(
            ClassBuilder::new()
                .name("now")
                .binding_mode("Immediate")
                .parameter("type", "fast")
                .build(),
        )
        .node_mode(NODE, &[])
        .claim(pvc.clone())
        .start([Step::GetCapacity { expected, answer }, node_selected(200)])
        .await;
    let wait = waits(
        &reconcile(&scenario, pvc.clone()).await,
        Duration::ZERO..=Duration::from_secs(1),
    );
    sleep_past(wait).await;
    assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
    assert!(scenario.finish().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn allowed_topologies_without_this_node_leave_the_claim_to_others() {
    let mut class = ClassBuilder::new()
        .name("elsewhere")
        .binding_mode("Immediate")
        .build();
    class.allowed_topologies = Some(vec![k8s_openapi::api::core::v1::TopologySelectorTerm {
        match_label_expressions: Some(vec![
            k8s_openapi::api::core::v1::TopologySelectorLabelRequirement {
                key: NODE_KEY.into(),
                values: vec!["node-a".into()],
            },
        ]),
    }]);
    let pvc = claim().class("elsewhere").build();
    let scenario = node_b().class(class).claim(pvc.clone()).start([]).await;
    // Decided before the first delay, as upstream: no wait, no call.
    assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
    assert!(scenario.finish().await.is_empty());
}
