//! A thread-local value set for the length of a call: how a drive's blocking thread takes on the share and
//! the mark of the task it works for.

use std::cell::Cell;
use std::thread::LocalKey;

/// Runs `work` with `key` set to `value` on this thread; the value before is restored after, even when
/// `work` panics (a pooled blocking thread must not keep another task's value).
pub(crate) fn with_thread_value<T: Copy + 'static, R>(
    key: &'static LocalKey<Cell<T>>,
    value: T,
    work: impl FnOnce() -> R,
) -> R {
    struct Restore<T: Copy + 'static>(&'static LocalKey<Cell<T>>, T);
    impl<T: Copy + 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(key, key.with(|c| c.replace(value)));
    work()
}
