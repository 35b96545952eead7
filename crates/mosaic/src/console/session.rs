//! Console sessions: an access key signs in once, and the browser holds an opaque session id in an
//! HttpOnly, SameSite=Strict cookie. Every change also carries the session's CSRF token in a header (a
//! page of another site can make the browser send the cookie, never read the token). Sessions live in
//! memory only: a restart signs everyone out.

use hmac::{KeyInit, Mac};
use parking_lot::Mutex;
use rand::RngCore;
use sha2::Sha256;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The cookie that names a session.
pub const COOKIE: &str = "mosaic_console";
/// The header that carries the CSRF token on every change.
pub const CSRF_HEADER: &str = "x-mosaic-csrf";
/// Most sessions at once; signing in past it ends the least recently used one.
pub const MAX_SESSIONS: usize = 1024;
/// A session unused this long has ended.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// A session ends this long after sign-in, however used.
pub const MAX_AGE: Duration = Duration::from_secs(12 * 3600);

/// Most failed sign-ins from one address within `FAILURE_WINDOW`; past it, sign-in from there is refused
/// until the window ends (a secret cannot be guessed at the speed of the network).
pub const MAX_FAILURES: u32 = 10;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Most addresses whose failures are remembered (the oldest window makes room).
pub const MAX_FAILING_ADDRESSES: usize = 4096;

/// Failed sign-ins by address, per window.
#[derive(Default)]
pub struct Failures {
    by_address: Mutex<HashMap<std::net::IpAddr, (Instant, u32)>>,
}

impl Failures {
    /// None when `ip` may try to sign in now; else how long until it may.
    pub fn wait(&self, ip: std::net::IpAddr) -> Option<Duration> {
        let now = Instant::now();
        let map = self.by_address.lock();
        let (start, n) = map.get(&ip)?;
        let left = FAILURE_WINDOW.checked_sub(now.duration_since(*start))?;
        (*n >= MAX_FAILURES).then_some(left)
    }

    /// Counts a failed sign-in from `ip`.
    pub fn failed(&self, ip: std::net::IpAddr) {
        let now = Instant::now();
        let mut map = self.by_address.lock();
        if map.len() >= MAX_FAILING_ADDRESSES && !map.contains_key(&ip) {
            map.retain(|_, (start, _)| now.duration_since(*start) < FAILURE_WINDOW);
            if map.len() >= MAX_FAILING_ADDRESSES
                && let Some(oldest) = map.iter().min_by_key(|(_, (start, _))| *start).map(|(k, _)| *k)
            {
                map.remove(&oldest);
            }
        }
        let entry = map.entry(ip).or_insert((now, 0));
        if now.duration_since(entry.0) >= FAILURE_WINDOW {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
        debug_assert!(map.len() <= MAX_FAILING_ADDRESSES);
    }
}

/// Who a session is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub access_key: String,
    pub root: bool,
    pub csrf: String,
}

struct Entry {
    session: Session,
    started: Instant,
    last_used: Instant,
}

/// The sessions signed in, with their limits.
pub struct Sessions {
    entries: Mutex<HashMap<String, Entry>>,
    idle_timeout: Duration,
    max_age: Duration,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::new(IDLE_TIMEOUT, MAX_AGE)
    }
}

fn random_token() -> String {
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    hex::encode(b)
}

/// Whether two secrets are equal, in time that does not depend on where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    let mut key = [0u8; 32];
    rand::rng().fill_bytes(&mut key);
    let mac = |s: &str| {
        let mut m = hmac::Hmac::<Sha256>::new_from_slice(&key).expect("any key length");
        m.update(s.as_bytes());
        m
    };
    let expected = mac(a).finalize().into_bytes();
    mac(b).verify_slice(&expected).is_ok()
}

impl Sessions {
    /// How long a session lasts after sign-in.
    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    pub fn new(idle_timeout: Duration, max_age: Duration) -> Sessions {
        assert!(idle_timeout <= max_age, "a session cannot idle longer than it lives");
        Sessions { entries: Mutex::default(), idle_timeout, max_age }
    }

    /// Starts a session for a key that proved its secret; returns its id (for the cookie) and itself.
    pub fn start(&self, access_key: &str, root: bool) -> (String, Session) {
        let now = Instant::now();
        let session = Session { access_key: access_key.to_string(), root, csrf: random_token() };
        let id = random_token();
        let mut entries = self.entries.lock();
        entries.retain(|_, e| self.alive(e, now));
        if entries.len() >= MAX_SESSIONS
            && let Some(oldest) = entries.iter().min_by_key(|(_, e)| e.last_used).map(|(k, _)| k.clone())
        {
            entries.remove(&oldest);
        }
        entries.insert(id.clone(), Entry { session: session.clone(), started: now, last_used: now });
        debug_assert!(entries.len() <= MAX_SESSIONS);
        (id, session)
    }

    fn alive(&self, e: &Entry, now: Instant) -> bool {
        now.duration_since(e.last_used) < self.idle_timeout && now.duration_since(e.started) < self.max_age
    }

    /// The live session named by `id`, marked used now; an ended one is forgotten.
    pub fn get(&self, id: &str) -> Option<Session> {
        let now = Instant::now();
        let mut entries = self.entries.lock();
        let alive = self.alive(entries.get(id)?, now);
        if !alive {
            entries.remove(id);
            return None;
        }
        let e = entries.get_mut(id)?;
        e.last_used = now;
        Some(e.session.clone())
    }

    /// Ends a session (sign-out).
    pub fn end(&self, id: &str) {
        self.entries.lock().remove(id);
    }

    /// Ends every session of a key (it was deleted).
    pub fn end_key(&self, access_key: &str) {
        self.entries.lock().retain(|_, e| e.session.access_key != access_key);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }
}

/// The session id in a request's cookies, if any.
pub fn cookie_id(headers: &http::HeaderMap) -> Option<String> {
    let prefix = format!("{COOKIE}=");
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .find_map(|c| c.strip_prefix(&prefix))
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_string)
}

/// The Set-Cookie value that hands the browser a session id for `max_age` (or, with None, ends it).
pub fn set_cookie(id: Option<(&str, Duration)>, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    match id {
        Some((id, max_age)) => {
            format!("{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}", max_age.as_secs())
        }
        None => format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_by_its_id_until_it_ends() {
        let s = Sessions::default();
        let (id, session) = s.start("AK", true);
        assert_eq!(s.get(&id), Some(session.clone()));
        assert_eq!(s.get("0".repeat(64).as_str()), None);
        s.end(&id);
        assert_eq!(s.get(&id), None);
        let (id, _) = s.start("AK", false);
        s.end_key("AK");
        assert_eq!(s.get(&id), None);
    }

    #[test]
    fn an_idle_or_old_session_has_ended() {
        let s = Sessions::new(Duration::from_millis(0), Duration::from_secs(1));
        let (id, _) = s.start("AK", false);
        assert_eq!(s.get(&id), None, "idle past zero");
        assert_eq!(s.len(), 0, "forgotten when found ended");
    }

    #[test]
    fn sessions_are_bounded() {
        let s = Sessions::default();
        let first = s.start("AK", false).0;
        for _ in 0..MAX_SESSIONS {
            s.start("AK", false);
        }
        assert_eq!(s.len(), MAX_SESSIONS);
        assert_eq!(s.get(&first), None, "the least recently used made room");
    }

    #[test]
    fn cookies_are_read_only_when_well_formed() {
        let mut h = http::HeaderMap::new();
        let id = "ab".repeat(32);
        h.insert(http::header::COOKIE, format!("other=1; {COOKIE}={id}").parse().unwrap());
        assert_eq!(cookie_id(&h), Some(id));
        h.insert(http::header::COOKIE, format!("{COOKIE}=short").parse().unwrap());
        assert_eq!(cookie_id(&h), None);
        assert!(set_cookie(Some(("x", MAX_AGE)), false).contains("HttpOnly; SameSite=Strict; Max-Age=43200"));
        assert!(set_cookie(None, true).contains("Max-Age=0; Secure"));
    }

    #[test]
    fn failed_sign_ins_are_limited_per_address() {
        let f = Failures::default();
        let (a, b) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        for _ in 0..MAX_FAILURES - 1 {
            f.failed(a);
        }
        assert_eq!(f.wait(a), None, "below the limit");
        f.failed(a);
        assert!(f.wait(a).is_some_and(|w| w <= FAILURE_WINDOW), "at the limit");
        assert_eq!(f.wait(b), None, "another address is not held back");
        for i in 0..MAX_FAILING_ADDRESSES as u32 + 10 {
            f.failed(std::net::IpAddr::from(i.to_be_bytes()));
        }
        assert!(f.by_address.lock().len() <= MAX_FAILING_ADDRESSES);
    }

    #[test]
    fn secrets_compare_equal_only_when_equal() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
    }
}
