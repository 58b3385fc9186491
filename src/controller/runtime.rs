//! What every controller runs on, and nothing else of `controller` is imported here: the watches
//! and their stores (`cache`), per-object retry timing (`backoff`), the work queue of the
//! capacity controller (`queue`), the triggers, result logging and lock the long-lived tasks
//! share (`runner`), the `workqueue_*` measurement of the kube-runtime controllers (`measured`),
//! the driver call limits (`limits`), core/v1 Events (`events`) and finalizer patches
//! (`finalizers`). The bottom layer: the other folders import from here, never the reverse.

pub mod backoff;
pub mod cache;
pub mod events;
pub(super) mod finalizers;
pub mod limits;
pub(super) mod measured;
pub(super) mod queue;
pub(super) mod runner;
