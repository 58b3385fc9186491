//! What the long-lived tasks of the controllers share to run: the triggers that queue only
//! objects with work, the end of a controller whose store never listed, the logging of
//! kube-runtime's results, and the lock of their in-memory state.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt, future};
use kube::runtime::controller;
use kube::runtime::reflector::{Lookup, ObjectRef, Store};
use tracing::{debug, warn};

/// Periodic re-examination of every claim and volume, as upstream's 15-minute resync.
pub(in crate::controller) const RESYNC_PERIOD: Duration = Duration::from_secs(15 * 60);

/// A mutex's guard, also after a panic of another holder: every state behind these mutexes is
/// updated in single assignments, so a poisoned one is still whole.
pub(in crate::controller) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Polls a watch that only fills a store (no controller reads its stream).
pub(in crate::controller) async fn drive<K, E: std::fmt::Display>(
    changes: impl Stream<Item = Result<K, E>>,
) {
    changes
        .for_each(|change| {
            if let Err(error) = change {
                warn!(%error, "watch error");
            }
            future::ready(())
        })
        .await;
}

/// Runs a controller to its end, or stops it at `drained` if its store has not listed yet.
///
/// kube-runtime holds every reconcile until the controller's store has listed once, and its
/// graceful shutdown waits for that hold to end; it ends the watch by no longer polling it, so
/// a drain that comes first waits forever. That happened to a sidecar SIGTERMed 90 ms after it
/// became leader: it kept renewing the Lease, so the other replica never took over. Before the
/// store is ready no reconcile has started, so there is nothing to drain.
pub(in crate::controller) async fn until_drained_if_never_ready(
    controller: impl Future<Output = ()>,
    store_ready: impl Future<Output = bool>,
    drained: impl Future<Output = ()>,
) {
    let mut controller = std::pin::pin!(controller);
    tokio::select! {
        biased;
        () = &mut controller => return,
        true = store_ready => {}
        () = drained => {
            debug!("drained before the first list completed: nothing to wait for");
            return;
        }
    }
    controller.await;
}

/// The changed objects that have work. An object without work is never queued: kube-runtime's
/// scheduler keeps the memory of its longest queue for good, and at start-up every cached
/// object arrives at once (10 MiB kept for 10,000 claims and 10,000 PVs).
pub(in crate::controller) fn with_work<K, E>(
    changed: impl Stream<Item = Result<K, E>> + Send + 'static,
    has_work: impl Fn(&K) -> bool + Send + 'static,
) -> impl Stream<Item = Result<K, E>> + Send + 'static
where
    K: Send + 'static,
    E: Send + 'static,
{
    changed.try_filter(move |object| future::ready(has_work(object)))
}

/// Every `period`, the cached objects that have work (upstream re-examines every object each
/// 15 minutes; for those without work that finds nothing, so they are not queued, see
/// [`with_work`]).
pub(in crate::controller) fn resync_with_work<K>(
    store: Store<K>,
    has_work: impl Fn(&K) -> bool + Send + 'static,
    period: Duration,
) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: Lookup<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    futures::stream::unfold((), move |()| async move {
        tokio::time::sleep(period).await;
        Some(((), ()))
    })
    .flat_map(move |()| {
        let due: Vec<ObjectRef<K>> = store
            .state()
            .iter()
            .filter(|object| has_work(object))
            .map(|object| ObjectRef::from_obj(object.as_ref()))
            .collect();
        futures::stream::iter(due)
    })
}

/// The reconcilers report and retry their own failures; see `provisioner` and `deleter`.
pub(in crate::controller) fn never_fails<K, C>(
    _: Arc<K>,
    error: &std::convert::Infallible,
    _: Arc<C>,
) -> controller::Action {
    match *error {}
}

pub(in crate::controller) fn log_result<
    K: kube::Resource,
    E: std::fmt::Debug,
    Q: std::fmt::Debug,
>(
    result: Result<(ObjectRef<K>, controller::Action), controller::Error<E, Q>>,
) -> future::Ready<()> {
    match result {
        Ok((object, _)) => debug!(%object, "reconciled"),
        Err(controller::Error::ObjectNotFound(object)) => {
            debug!(%object, "object gone before its reconcile")
        }
        Err(error) => warn!(?error, "controller error"),
    }
    future::ready(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn a_drain_before_the_first_list_does_not_wait_for_the_held_controller() {
        let held_forever = future::pending::<()>();
        tokio::time::timeout(
            Duration::from_secs(5),
            until_drained_if_never_ready(held_forever, future::pending(), future::ready(())),
        )
        .await
        .expect("returned at the drain");
    }

    #[tokio::test]
    async fn once_the_store_is_ready_a_drain_waits_for_the_controller_to_finish() {
        let finished = Arc::new(AtomicBool::new(false));
        let (finish, finishing) = tokio::sync::oneshot::channel::<()>();
        let controller = {
            let finished = Arc::clone(&finished);
            async move {
                let _ = finishing.await;
                finished.store(true, Ordering::SeqCst);
            }
        };
        let run = tokio::spawn(until_drained_if_never_ready(
            controller,
            future::ready(true),
            future::ready(()),
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!run.is_finished(), "stopped before the controller finished");
        finish.send(()).unwrap();
        run.await.unwrap();
        assert!(finished.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_store_whose_writer_is_gone_leaves_the_drain_to_decide() {
        tokio::time::timeout(
            Duration::from_secs(5),
            until_drained_if_never_ready(
                future::pending::<()>(),
                future::ready(false),
                tokio::time::sleep(Duration::from_millis(20)),
            ),
        )
        .await
        .expect("returned at the drain");
    }
}
