//! A watcher of a built-in kind over protobuf: the same events, errors and states as
//! kube-runtime's `watcher` (which parses JSON only), so that its backoff, the reflector and
//! the controllers downstream take either.
//!
//! States, as kube-runtime's: start (a streamed list, i.e. a watch with `sendInitialEvents`,
//! or a list), then watch from the last resource version; a watch that ends or stalls resumes
//! from it; `410 Gone` starts over with a new list.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use futures::{AsyncRead, Stream, TryStreamExt, stream};
use http_body_util::BodyExt;
use kube::api::{ListParams, VersionMatch, WatchParams};
use kube::core::{Request, Status};
use kube::runtime::watcher::{self, Event, InitialListStrategy, ListSemantic};
use kube::{Client, Resource};
use tracing::{debug, warn};

use super::protobuf::{
    self, ACCEPT, ACCEPT_WATCH, FromProtobuf, ProtobufError, WatchEvent, decode_watch_event,
};

type Frames = Pin<Box<dyn AsyncRead + Send>>;

enum State<K> {
    Start,
    /// Listing, page by page (with a page size) or at once.
    Listing {
        continue_token: Option<String>,
        items: VecDeque<K>,
        resource_version: Option<String>,
    },
    /// The initial events of a streamed list.
    Streaming {
        frames: Frames,
    },
    /// Listed: the watch starts from `resource_version`.
    Listed {
        resource_version: String,
    },
    Watching {
        resource_version: String,
        frames: Frames,
    },
}

/// The watch of every object of `K` (cluster-wide), decoded from protobuf.
pub fn watcher<K>(
    client: Client,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + FromProtobuf + Send + 'static,
{
    let path = K::url_path(&(), None);
    let watch = Watch {
        client,
        config,
        path,
    };
    stream::unfold((watch, State::Start), |(watch, mut state)| async move {
        loop {
            let (item, next) = watch.step(state).await;
            state = next;
            if let Some(item) = item {
                return Some((item, (watch, state)));
            }
        }
    })
}

struct Watch {
    client: Client,
    config: watcher::Config,
    path: String,
}

type Step<K> = (Option<Result<Event<K>, watcher::Error>>, State<K>);

impl Watch {
    fn streamed(&self) -> bool {
        self.config.initial_list_strategy == InitialListStrategy::StreamingList
    }

    /// A watch answer that went silent longer than the server's own timeout (plus margin) is a
    /// dead connection.
    fn idle_limit(&self) -> Duration {
        Duration::from_secs(u64::from(self.config.timeout.unwrap_or(290)) + 30)
    }

    fn list_params(&self, continue_token: Option<String>) -> ListParams {
        let (resource_version, version_match) = match self.config.list_semantic {
            ListSemantic::Any => (Some("0".to_owned()), Some(VersionMatch::NotOlderThan)),
            ListSemantic::MostRecent => (None, None),
        };
        ListParams {
            label_selector: self.config.label_selector.clone(),
            field_selector: self.config.field_selector.clone(),
            resource_version,
            version_match,
            limit: self.config.page_size,
            continue_token,
            ..ListParams::default()
        }
    }

    fn watch_params(&self, initial: bool) -> WatchParams {
        WatchParams {
            label_selector: self.config.label_selector.clone(),
            field_selector: self.config.field_selector.clone(),
            timeout: self.config.timeout,
            bookmarks: self.config.bookmarks,
            send_initial_events: initial && self.streamed(),
        }
    }

    async fn step<K>(&self, state: State<K>) -> Step<K>
    where
        K: Resource<DynamicType = ()> + FromProtobuf + Send,
    {
        match state {
            State::Start if self.streamed() => match self.open_watch(true, "0").await {
                Ok(frames) => (Some(Ok(Event::Init)), State::Streaming { frames }),
                Err(error) => (
                    Some(Err(watcher::Error::WatchStartFailed(error))),
                    State::Start,
                ),
            },
            State::Start => (
                Some(Ok(Event::Init)),
                State::Listing {
                    continue_token: None,
                    items: VecDeque::new(),
                    resource_version: None,
                },
            ),
            State::Listing {
                continue_token,
                mut items,
                resource_version,
            } => {
                if let Some(item) = items.pop_front() {
                    let state = State::Listing {
                        continue_token,
                        items,
                        resource_version,
                    };
                    return (Some(Ok(Event::InitApply(item))), state);
                }
                if continue_token.is_none()
                    && let Some(resource_version) = resource_version
                {
                    return (
                        Some(Ok(Event::InitDone)),
                        State::Listed { resource_version },
                    );
                }
                match self.list(continue_token).await {
                    Ok(page) => {
                        let continue_token = Some(page.continue_token).filter(|t| !t.is_empty());
                        let resource_version =
                            Some(page.resource_version).filter(|v| !v.is_empty());
                        if continue_token.is_none() && resource_version.is_none() {
                            return (Some(Err(watcher::Error::NoResourceVersion)), State::Start);
                        }
                        let state = State::Listing {
                            continue_token,
                            items: page.items.into(),
                            resource_version,
                        };
                        (None, state)
                    }
                    Err(error) => (
                        Some(Err(watcher::Error::InitialListFailed(error))),
                        State::Start,
                    ),
                }
            }
            State::Streaming { mut frames } => match self.next_event(&mut frames).await {
                Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => (
                    Some(Ok(Event::InitApply(object))),
                    State::Streaming { frames },
                ),
                // The API server sends none while it streams the initial events.
                Some(Ok(WatchEvent::Deleted(_))) => (None, State::Streaming { frames }),
                Some(Ok(WatchEvent::Bookmark {
                    resource_version,
                    initial_events_end: true,
                })) => (
                    Some(Ok(Event::InitDone)),
                    State::Watching {
                        resource_version,
                        frames,
                    },
                ),
                Some(Ok(WatchEvent::Bookmark { .. })) => (None, State::Streaming { frames }),
                Some(Ok(WatchEvent::Error(status))) => {
                    let next = if status.code == 410 {
                        State::Start
                    } else {
                        State::Streaming { frames }
                    };
                    (Some(Err(watch_error(status))), next)
                }
                // An object that cannot be decoded is reported and skipped, as kube-runtime
                // skips one it cannot parse: the next frame is intact.
                Some(Err(error)) if !broken(&error) => (
                    Some(Err(watcher::Error::WatchFailed(error))),
                    State::Streaming { frames },
                ),
                // A broken stream restarts the initial events from scratch: the store only
                // swaps in a list once it is whole.
                Some(Err(error)) => (Some(Err(watcher::Error::WatchFailed(error))), State::Start),
                None => (None, State::Start),
            },
            State::Listed { resource_version } => {
                match self.open_watch(false, &resource_version).await {
                    Ok(frames) => (
                        None,
                        State::Watching {
                            resource_version,
                            frames,
                        },
                    ),
                    Err(error) => (
                        Some(Err(watcher::Error::WatchStartFailed(error))),
                        State::Listed { resource_version },
                    ),
                }
            }
            State::Watching {
                resource_version,
                mut frames,
            } => match self.next_event(&mut frames).await {
                Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                    applied(object, frames, Event::Apply)
                }
                Some(Ok(WatchEvent::Deleted(object))) => applied(object, frames, Event::Delete),
                Some(Ok(WatchEvent::Bookmark {
                    resource_version, ..
                })) => (
                    None,
                    State::Watching {
                        resource_version,
                        frames,
                    },
                ),
                Some(Ok(WatchEvent::Error(status))) => {
                    let next = if status.code == 410 {
                        State::Start
                    } else {
                        State::Watching {
                            resource_version,
                            frames,
                        }
                    };
                    (Some(Err(watch_error(status))), next)
                }
                Some(Err(error)) if !broken(&error) => (
                    Some(Err(watcher::Error::WatchFailed(error))),
                    State::Watching {
                        resource_version,
                        frames,
                    },
                ),
                Some(Err(error)) => (
                    Some(Err(watcher::Error::WatchFailed(error))),
                    State::Listed { resource_version },
                ),
                None => (None, State::Listed { resource_version }),
            },
        }
    }

    async fn list<K: FromProtobuf>(
        &self,
        continue_token: Option<String>,
    ) -> Result<protobuf::ListPage<K>, kube::Error> {
        let request = Request::new(&self.path)
            .list(&self.list_params(continue_token))
            .map_err(kube::Error::BuildRequest)?;
        let body = protobuf::send(&self.client, request, ACCEPT)
            .await
            .inspect_err(refused)?;
        let bytes = protobuf::collect(body).await?;
        protobuf::decode_list(&bytes).map_err(decode_error)
    }

    async fn open_watch(&self, initial: bool, version: &str) -> Result<Frames, kube::Error> {
        let request = Request::new(&self.path)
            .watch(&self.watch_params(initial), version)
            .map_err(kube::Error::BuildRequest)?;
        let body = protobuf::send(&self.client, request, ACCEPT_WATCH)
            .await
            .inspect_err(refused)?;
        let frames = body
            .into_data_stream()
            .map_err(std::io::Error::other)
            .into_async_read();
        Ok(Box::pin(frames))
    }

    /// The next event, `None` at the stream's end or after [`Watch::idle_limit`] of silence.
    async fn next_event<K: FromProtobuf>(
        &self,
        frames: &mut Frames,
    ) -> Option<Result<WatchEvent<K>, kube::Error>> {
        let frame =
            match tokio::time::timeout(self.idle_limit(), protobuf::read_frame(frames)).await {
                Err(_) => {
                    debug!(path = self.path, "watch silent too long; resuming");
                    return None;
                }
                Ok(Ok(None)) => return None,
                Ok(Ok(Some(frame))) => frame,
                Ok(Err(error)) => return Some(Err(kube::Error::ReadEvents(error))),
            };
        Some(decode_watch_event(&frame).map_err(decode_error))
    }
}

/// An applied or deleted object moves the watch to its resource version.
fn applied<K: Resource>(object: K, frames: Frames, event: fn(K) -> Event<K>) -> Step<K> {
    match object
        .meta()
        .resource_version
        .clone()
        .filter(|v| !v.is_empty())
    {
        Some(resource_version) => (
            Some(Ok(event(object))),
            State::Watching {
                resource_version,
                frames,
            },
        ),
        None => (Some(Err(watcher::Error::NoResourceVersion)), State::Start),
    }
}

fn watch_error(status: Box<Status>) -> watcher::Error {
    if status.code == 403 {
        warn!(%status.message, "watch refused (403)");
    }
    watcher::Error::WatchError(status)
}

/// A 403 says the sidecar's RBAC lacks a rule: worth a warning, as kube-runtime gives.
fn refused(error: &kube::Error) {
    if let kube::Error::Api(status) = error
        && status.is_forbidden()
    {
        warn!(%status.message, "watch refused (403)");
    }
}

/// Whether a watch error broke the stream (a read failed) rather than one frame's content.
fn broken(error: &kube::Error) -> bool {
    matches!(error, kube::Error::ReadEvents(_))
}

fn decode_error(error: ProtobufError) -> kube::Error {
    kube::Error::Service(Box::new(error))
}
