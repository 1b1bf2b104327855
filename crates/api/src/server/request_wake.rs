//! Whether a continuous Watch stream's requests woke its response body.
//!
//! The body is polled each time a change set is queued for its node, and a continuous
//! stream's requests (a rename, the end of the stream) are rare; polling the request stream on
//! every change set took ~4 % of the brain's CPU per change at 5,000 nodes (a lock of the
//! connection's stream state and a decode attempt each). The request stream is polled with a
//! waker of its own instead, and only after it woke.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};

/// The request stream's waker: records that it fired, then wakes the body's task.
#[derive(Debug)]
struct Flag {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        let task = self
            .task
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(task) = task.as_ref() {
            task.wake_by_ref();
        }
    }
}

/// One stream's request waker (see the module's documentation).
#[derive(Debug)]
pub(super) struct RequestWake {
    flag: Arc<Flag>,
    waker: Waker,
}

impl Default for RequestWake {
    /// Woken: the first poll looks at the request stream.
    fn default() -> RequestWake {
        let flag = Arc::new(Flag {
            woken: AtomicBool::new(true),
            task: Mutex::new(None),
        });
        let waker = Waker::from(flag.clone());
        RequestWake { flag, waker }
    }
}

impl RequestWake {
    /// With the body's task registered as the one to wake (`cx`): the waker to poll the
    /// request stream with, if it woke since it was last polled; `None` when it did not (it
    /// will wake the task when something comes).
    pub(super) fn take(&self, cx: &Context<'_>) -> Option<&Waker> {
        {
            let mut task = self
                .flag
                .task
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            match task.as_mut() {
                Some(t) => t.clone_from(cx.waker()),
                None => *task = Some(cx.waker().clone()),
            }
        }
        // Registered first, so a wake after this swap reaches the task.
        self.flag
            .woken
            .swap(false, Ordering::AcqRel)
            .then_some(&self.waker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wakes of the body's task.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_request_stream_is_polled_first_then_only_after_it_woke() {
        let wake = RequestWake::default();
        let count = Arc::new(Count::default());
        let task = Waker::from(count.clone());
        let cx = Context::from_waker(&task);
        let request_waker = wake.take(&cx).expect("polled at first").clone();
        assert!(wake.take(&cx).is_none(), "not woken since");
        assert!(wake.take(&cx).is_none(), "still not");
        request_waker.wake_by_ref();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "the task is woken");
        assert!(wake.take(&cx).is_some(), "polled again after the wake");
        assert!(wake.take(&cx).is_none());
    }
}
