//! The queues of the kube-runtime controllers (claims, volumes, cloning protection), measured
//! as client-go's work queues (`workqueue_*`, see `crate::metrics`).
//!
//! kube-runtime's scheduler is the queue: it keeps one entry per object, runs an object
//! triggered while it is reconciled once more afterwards, and re-runs a requeued object when
//! its delay ends, unless a trigger comes first. It has no hooks, so what goes in and out of
//! it is recorded around it: every trigger stream (an add), the reconcile (taken, done), the
//! [`Next`] a reconcile answers (a retry), and an object gone before its turn (taken and done
//! at once, as client-go's worker takes the key and finds nothing). Our controllers run every
//! due object at once (the driver calls wait for `--worker-threads` permits inside the
//! reconcile), so the depth counts objects not started yet and the work duration includes
//! the wait for a permit.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use kube::Resource;
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::ObjectRef;

use crate::metrics::{QueueKey, QueueMetrics};

/// What a reconcile answers: wait for the next change, or come back after a delay (a retry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Wait,
    RetryIn(Duration),
}

/// One controller's queue recorder.
#[derive(Clone)]
pub(in crate::controller) struct Measured {
    queue: Arc<QueueMetrics>,
}

impl Measured {
    pub(in crate::controller) fn new(queue: Arc<QueueMetrics>) -> Self {
        Measured { queue }
    }

    fn key(&self, namespace: Option<&str>, name: &str) -> QueueKey {
        self.queue.key(&(namespace, name))
    }

    fn object_key<K: Resource>(&self, object: &K) -> QueueKey {
        let meta = object.meta();
        self.key(
            meta.namespace.as_deref(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }

    fn ref_key<K: Resource>(&self, object: &ObjectRef<K>) -> QueueKey {
        self.key(object.namespace.as_deref(), &object.name)
    }

    /// A trigger stream of objects (the watch), each an add.
    pub(in crate::controller) fn objects<K: Resource, E, S: Stream<Item = Result<K, E>>>(
        &self,
        objects: S,
    ) -> impl Stream<Item = Result<K, E>> + use<K, E, S> {
        let this = self.clone();
        objects.inspect_ok(move |object| this.queue.added(this.object_key(object)))
    }

    /// A trigger stream of references (a resync), each an add.
    pub(in crate::controller) fn refs<K: Resource, S: Stream<Item = ObjectRef<K>>>(
        &self,
        refs: S,
    ) -> impl Stream<Item = ObjectRef<K>> + use<K, S> {
        let this = self.clone();
        refs.inspect(move |object| this.queue.added(this.ref_key(object)))
    }

    /// What a watched object's mapper returns, each an add.
    pub(in crate::controller) fn mapped<K: Resource, I: IntoIterator<Item = ObjectRef<K>>>(
        &self,
        refs: I,
    ) -> impl Iterator<Item = ObjectRef<K>> + use<K, I> {
        let this = self.clone();
        refs.into_iter()
            .inspect(move |object| this.queue.added(this.ref_key(object)))
    }

    /// The reconcile for kube-runtime: taken when it starts, done when it ends, a retry when
    /// it answers [`Next::RetryIn`].
    pub(in crate::controller) fn reconcile<K, C, Fut, R>(
        &self,
        mut reconcile: R,
    ) -> impl FnMut(Arc<K>, Arc<C>) -> BoxFuture<'static, Result<Action, Infallible>> + use<K, C, Fut, R>
    where
        K: Resource,
        R: FnMut(Arc<K>, Arc<C>) -> Fut,
        Fut: Future<Output = Result<Next, Infallible>> + Send + 'static,
    {
        let this = self.clone();
        move |object, ctx| {
            let key = this.object_key(object.as_ref());
            this.queue.started(key);
            let queue = Arc::clone(&this.queue);
            reconcile(object, ctx)
                .map(move |Ok(next)| {
                    queue.done(key);
                    Ok(match next {
                        Next::Wait => Action::await_change(),
                        Next::RetryIn(delay) => {
                            queue.retried(key, delay);
                            Action::requeue(delay)
                        }
                    })
                })
                .boxed()
        }
    }

    /// Looks at each result of the controller: an object gone before its reconcile ran was
    /// still taken from the queue.
    pub(in crate::controller) fn results<K, E, Q, S>(
        &self,
        results: S,
    ) -> impl Stream<Item = S::Item> + use<K, E, Q, S>
    where
        K: Resource,
        E: 'static,
        Q: 'static,
        S: Stream<Item = Result<(ObjectRef<K>, Action), controller::Error<E, Q>>>,
    {
        let this = self.clone();
        results.inspect(move |result| {
            if let Err(controller::Error::ObjectNotFound(object)) = result {
                let key = this.ref_key(object.as_ref());
                this.queue.started(key);
                this.queue.done(key);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PersistentVolume;
    use kube::api::ObjectMeta;

    use super::*;
    use crate::metrics::Metrics;

    fn pv(name: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..PersistentVolume::default()
        }
    }

    fn value(metrics: &Metrics, series: &str) -> String {
        let prefix = format!("workqueue_{series}{{name=\"volumes\"}} ");
        let text = metrics.encode();
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
            .to_owned()
    }

    /// A watch trigger, a reconcile answering a retry, the retry's run, and a trigger for an
    /// object gone before its turn: what client-go's queue would count.
    #[tokio::test]
    async fn triggers_reconciles_retries_and_vanished_objects_are_counted() {
        let metrics = Metrics::new();
        let measured = Measured::new(metrics.queue(crate::metrics::VOLUMES_QUEUE));
        let triggered: Vec<Result<PersistentVolume, Infallible>> = measured
            .objects(futures::stream::iter([Ok(pv("a"))]))
            .collect()
            .await;
        assert_eq!(triggered.len(), 1);
        assert_eq!(value(&metrics, "depth"), "1");

        let mut answers = vec![Next::Wait, Next::RetryIn(Duration::from_millis(1))];
        let mut reconcile = measured.reconcile(move |_: Arc<PersistentVolume>, _: Arc<()>| {
            future_ok(answers.pop().unwrap_or(Next::Wait))
        });
        let action = reconcile(Arc::new(pv("a")), Arc::new(())).await;
        assert_eq!(action.ok(), Some(Action::requeue(Duration::from_millis(1))));
        assert_eq!(value(&metrics, "depth"), "0");
        assert_eq!(value(&metrics, "retries_total"), "1");
        // The delay ends: kube-runtime runs it again without a trigger.
        let action = reconcile(Arc::new(pv("a")), Arc::new(())).await;
        assert_eq!(action.ok(), Some(Action::await_change()));
        assert_eq!(value(&metrics, "adds_total"), "2");

        let resynced: Vec<ObjectRef<PersistentVolume>> = measured
            .refs(futures::stream::iter([ObjectRef::new("gone")]))
            .collect()
            .await;
        assert_eq!(value(&metrics, "depth"), "1");
        let gone = controller::Error::<Infallible, Infallible>::ObjectNotFound(Box::new(
            resynced[0].clone().erase(),
        ));
        let results: Vec<_> = measured
            .results(futures::stream::iter([Err::<
                (ObjectRef<PersistentVolume>, Action),
                _,
            >(gone)]))
            .collect()
            .await;
        assert_eq!(results.len(), 1);
        assert_eq!(value(&metrics, "depth"), "0");
        assert_eq!(value(&metrics, "adds_total"), "3");
        assert_eq!(value(&metrics, "work_duration_seconds_count"), "3");
        assert_eq!(value(&metrics, "queue_duration_seconds_count"), "3");
    }

    fn future_ok(next: Next) -> futures::future::Ready<Result<Next, Infallible>> {
        futures::future::ready(Ok(next))
    }
}
