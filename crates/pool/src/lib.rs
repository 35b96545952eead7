//! Several stores as one (DESIGN.md section 5): a pool of erasure sets, each object on exactly one member,
//! chosen by a stable hash of its locator (`mosaic_store::locator`), as MinIO places an object on one set
//! of a pool by a hash of its name. Nothing is kept about where an object is: its name says it.
//!
//! - `placement`: the member an object lives on.
//! - `scopes`: parts of the objects placed on some members only (a microstore's sets), the home members
//!   of the others, and their moves.
//! - `moving`: objects of a moving scope taken to their new member, by the writes that touch them and by
//!   `Pool::move_objects` in the background.
//! - `snapshot`: lookups and reads on the member of each object; listings merged from every member's
//!   ordered names.
//! - `commit`: a transaction applied on the one member its objects live on (a clone between members
//!   copies the data); collections kept on every member, with the home member (0) as their catalog.
//!
//! The pool is generic over the member store: an erasure set in the server, a single drive in tests.

mod commit;
mod moving;
mod placement;
mod scopes;
mod snapshot;

pub use moving::MoveReport;
pub use placement::member_of;
pub use scopes::{Home, MAX_SCOPES, Scope};
pub use snapshot::{PoolObj, PoolSnapshot};

use async_trait::async_trait;
use mosaic_store::{
    AlignedBuf, ErrorKind, Geometry, Outcome, PriorityHold, Snapshot, Store, StoreError, StoreResult, Txn,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Most members a pool has (a pool of 16-drive sets stays under 4,096 drives).
pub const MAX_MEMBERS: usize = 256;
/// Collections whose handles the pool remembers (more are looked up again).
const MAX_CACHED_COLLECTIONS: usize = 4096;
/// Collections whose handles a pool takes over from the pool it replaces (`Pool::take_collections_from`).
const MAX_TAKEN_COLLECTIONS: usize = 256;

/// A collection as each member names it.
#[derive(Clone, Debug)]
pub struct PoolColl<C> {
    pub(crate) name: Arc<str>,
    pub(crate) members: Handles<C>,
}

/// A collection's handle on each member.
pub(crate) type Handles<C> = Arc<[Handle<C>]>;

/// A collection's handle on one member.
#[derive(Clone, Debug)]
pub(crate) enum Handle<C> {
    Present(C),
    /// Not there yet: a creation that this member missed (it is created there by the first write).
    Absent,
    /// The member could not say (too few of its drives answer).
    Unreachable(StoreError),
}

/// Units staged on one member, with the placement they were placed by (kept alive while they are: a move
/// does not end while units staged before it began may still be written to the member it leaves).
pub struct PoolStaged<St> {
    pub(crate) member: usize,
    pub(crate) staged: St,
    pub(crate) _placement: Arc<scopes::Placement>,
    /// Holds the object's units to this member while any of them are staged (`Pool::stage_in`).
    pub(crate) _pin: Arc<()>,
}

/// Objects with units staged and not yet written, and the member they are staged on: an object's later
/// units go where its first went, so a body staged across a change of placement lies on one member.
#[derive(Default)]
pub(crate) struct Pins {
    by_name: HashMap<(String, Vec<u8>), (usize, std::sync::Weak<()>)>,
}

/// Pinned objects a pool keeps before it forgets those whose units are gone.
const MAX_PINS: usize = 4096;

impl Pins {
    /// The member of an object's staged units, or `member` (pinned from now on), and the pin to hold.
    fn pin(&mut self, coll: &str, name: &[u8], member: usize) -> (usize, Arc<()>) {
        let key = (coll.to_string(), name.to_vec());
        if let Some((pinned, pin)) = self.by_name.get(&key)
            && let Some(pin) = pin.upgrade()
        {
            return (*pinned, pin);
        }
        if self.by_name.len() >= MAX_PINS {
            self.by_name.retain(|_, (_, pin)| pin.strong_count() > 0);
        }
        let pin = Arc::new(());
        // Past the limit with every pin held, the object is not pinned: if a move begins while its body is
        // staged, its units lie on two members and its write fails (`commit::relocation`), never misplaced.
        if self.by_name.len() < MAX_PINS {
            self.by_name.insert(key, (member, Arc::downgrade(&pin)));
        }
        debug_assert!(self.by_name.len() <= MAX_PINS);
        (member, pin)
    }
}

/// Several stores as one. Cheap to clone.
pub struct Pool<S: Store> {
    pub(crate) inner: Arc<PoolInner<S>>,
}

impl<S: Store> Clone for Pool<S> {
    fn clone(&self) -> Self {
        Pool { inner: self.inner.clone() }
    }
}

pub(crate) struct PoolInner<S: Store> {
    pub(crate) members: Vec<Arc<S>>,
    /// Object writes hold it shared, collection changes exclusively: no write lands in a collection on one
    /// member while the collection is being removed from the others.
    pub(crate) gate: tokio::sync::RwLock<()>,
    /// Handles of collections on every member, by name; dropped when the pool creates or removes one.
    pub(crate) colls: Mutex<HashMap<String, PoolColl<S::Coll>>>,
    /// Where objects live: over all members, or their scope's.
    pub(crate) placement: parking_lot::RwLock<Arc<scopes::Placement>>,
    /// Locks of objects of moving scopes, held by the writes that move them and the background moves.
    pub(crate) moving: moving::Moving,
    /// The placements before the current one (while staged units or requests still hold them).
    pub(crate) previous: Mutex<Vec<std::sync::Weak<scopes::Placement>>>,
    pub(crate) pins: Mutex<Pins>,
}

impl<S: Store> PoolInner<S> {
    pub(crate) fn placement(&self) -> Arc<scopes::Placement> {
        self.placement.read().clone()
    }

    pub(crate) fn cached(&self, name: &str) -> Option<PoolColl<S::Coll>> {
        self.colls.lock().get(name).cloned()
    }

    pub(crate) fn remember(&self, coll: &PoolColl<S::Coll>) {
        let mut colls = self.colls.lock();
        if colls.len() >= MAX_CACHED_COLLECTIONS {
            colls.clear();
        }
        colls.insert(coll.name.to_string(), coll.clone());
    }

    pub(crate) fn forget(&self, name: &str) {
        self.colls.lock().remove(name);
    }
}

impl<S: Store> Pool<S> {
    /// A pool over `members`, in their fixed order (the order places objects: it never changes).
    pub fn new(members: Vec<Arc<S>>) -> StoreResult<Self> {
        let invalid = |why: String| Err(StoreError::new(ErrorKind::InvalidArgument, why));
        if members.is_empty() || members.len() > MAX_MEMBERS {
            return invalid(format!("a pool has 1 to {MAX_MEMBERS} members, not {}", members.len()));
        }
        let g = members[0].geometry();
        if let Some(i) = members.iter().position(|m| m.geometry() != g) {
            return invalid(format!(
                "member {i} works in other units than member 0 ({:?} vs {g:?})",
                members[i].geometry()
            ));
        }
        let placement = parking_lot::RwLock::new(Arc::new(scopes::Placement::flat(members.len())));
        let inner = PoolInner {
            members,
            gate: Default::default(),
            colls: Default::default(),
            placement,
            moving: Default::default(),
            previous: Default::default(),
            pins: Default::default(),
        };
        Ok(Pool { inner: Arc::new(inner) })
    }

    pub fn members(&self) -> &[Arc<S>] {
        &self.inner.members
    }

    /// Places the objects of `scopes` on their members from now on (those of no scope stay on the home
    /// members).
    /// A scope whose members change must say where its objects were (`moving_from`) until
    /// `move_objects` reports it settled; a scope given without `moving_from` must already be where its
    /// members say (a scope dropped or narrowed without a move hides its objects). Waits for the writes
    /// under way.
    pub async fn set_scopes(&self, scopes: Vec<Scope>) -> StoreResult<()> {
        let _gate = self.inner.gate.write().await;
        let home = self.inner.placement().home();
        self.replace_placement(home, scopes)
    }

    /// Places the objects of `scopes` on their members, and the others on `home`'s, from now on (as
    /// `set_scopes`: a home whose members change says where its objects were until `move_objects` reports
    /// it settled). Waits for the writes under way.
    pub async fn set_placement(&self, home: Home, scopes: Vec<Scope>) -> StoreResult<()> {
        let _gate = self.inner.gate.write().await;
        self.replace_placement(home, scopes)
    }

    /// Under the gate, held exclusively: no write plans with the placement replaced.
    fn replace_placement(&self, home: Home, scopes: Vec<Scope>) -> StoreResult<()> {
        let placement = Arc::new(scopes::Placement::new(self.inner.members.len(), home, scopes)?);
        let before = std::mem::replace(&mut *self.inner.placement.write(), placement);
        let mut previous = self.inner.previous.lock();
        previous.retain(|p| p.strong_count() > 0);
        previous.push(Arc::downgrade(&before));
        self.inner.moving.forget_cursors();
        Ok(())
    }

    /// The scopes as set.
    pub fn scopes(&self) -> Vec<Scope> {
        self.inner.placement().scopes().to_vec()
    }

    /// The home members as set.
    pub fn home(&self) -> Home {
        self.inner.placement().home()
    }

    /// Takes over the collection handles `previous` remembers, when this pool replaces it with some of its
    /// members changed (a cluster's new map reopens only the groups it moves): a member it shares (the
    /// same store at the same position) keeps its handle, a changed member is asked again. So a new pool
    /// does not look every collection up on every member again at its first use. Only when at most half
    /// the members changed, for at most `MAX_TAKEN_COLLECTIONS` collections; a collection that a changed
    /// member cannot answer for (or that the home member no longer has) is looked up at its first use.
    /// The number of collections taken over.
    pub async fn take_collections_from(&self, previous: &Pool<S>) -> usize {
        let members = &self.inner.members;
        if previous.inner.members.len() != members.len() {
            return 0;
        }
        let same = |i: usize| Arc::ptr_eq(&previous.inner.members[i], &members[i]);
        let changed: Vec<usize> = (0..members.len()).filter(|i| !same(*i)).collect();
        if changed.len() * 2 > members.len() {
            return 0;
        }
        let remembered: Vec<PoolColl<S::Coll>> = previous.inner.colls.lock().values().cloned().collect();
        if remembered.len() > MAX_TAKEN_COLLECTIONS {
            return 0;
        }
        let snaps: Vec<(usize, S::Snapshot)> = changed.iter().map(|i| (*i, members[*i].snapshot())).collect();
        let ask = |coll: PoolColl<S::Coll>| {
            let snaps = &snaps;
            async move {
                let mut handles = coll.members.to_vec();
                for (i, snap) in snaps {
                    handles[*i] = match snap.collection(&coll.name).await {
                        Ok(Some(c)) => Handle::Present(c),
                        Ok(None) if *i != 0 => Handle::Absent,
                        _ => return None,
                    };
                }
                debug_assert!(matches!(handles[0], Handle::Present(_)), "the home member has what is remembered");
                Some((coll.members.clone(), PoolColl { name: coll.name, members: handles.into() }))
            }
        };
        let asked = futures::future::join_all(remembered.into_iter().map(ask)).await;
        // A collection the previous pool created or removed meanwhile changed its handles there: not taken.
        let still = previous.inner.colls.lock();
        let unchanged = |(before, c): &(Handles<S::Coll>, PoolColl<S::Coll>)| {
            still.get(&*c.name).is_some_and(|p| Arc::ptr_eq(&p.members, before))
        };
        let taken: Vec<PoolColl<S::Coll>> = asked.into_iter().flatten().filter(unchanged).map(|(_, c)| c).collect();
        drop(still);
        for coll in &taken {
            self.inner.remember(coll);
        }
        taken.len()
    }
}

#[async_trait]
impl<S: Store> Store for Pool<S> {
    type Coll = PoolColl<S::Coll>;
    type Obj = snapshot::ObjOf<S>;
    type Staged = PoolStaged<S::Staged>;
    type Snapshot = PoolSnapshot<S>;

    fn geometry(&self) -> Geometry {
        self.inner.members[0].geometry()
    }

    fn snapshot(&self) -> PoolSnapshot<S> {
        PoolSnapshot::new(self.inner.clone())
    }

    async fn stage(&self, buf: AlignedBuf, len_bytes: usize, hint: &[u8]) -> StoreResult<(Self::Staged, AlignedBuf)> {
        let placement = self.inner.placement();
        let member = member_of(mosaic_store::locator(hint), self.inner.members.len());
        let (staged, buf) = self.inner.members[member].stage(buf, len_bytes, hint).await?;
        Ok((PoolStaged { member, staged, _placement: placement, _pin: Arc::new(()) }, buf))
    }

    async fn stage_in(
        &self,
        coll: &Self::Coll,
        name: &[u8],
        buf: AlignedBuf,
        len_bytes: usize,
        hint: &[u8],
    ) -> StoreResult<(Self::Staged, AlignedBuf)> {
        let placement = self.inner.placement();
        let (member, pin) = self.inner.pins.lock().pin(&coll.name, name, placement.place(&coll.name, name).now);
        let (staged, buf) = self.inner.members[member].stage(buf, len_bytes, hint).await?;
        Ok((PoolStaged { member, staged, _placement: placement, _pin: pin }, buf))
    }

    async fn commit(&self, txn: Txn<Self::Coll, Self::Staged>) -> StoreResult<Outcome> {
        commit::commit(&self.inner, txn).await
    }

    fn hold_priority(&self) -> PriorityHold {
        let holds: Vec<PriorityHold> = self.inner.members.iter().map(|m| m.hold_priority()).collect();
        Box::new(holds)
    }

    /// Ready while every member is: an object's member is fixed, so a member without a write quorum
    /// refuses the writes of its share of the keys.
    fn is_ready(&self) -> bool {
        self.inner.members.iter().all(|m| m.is_ready())
    }

    async fn close(&self) -> StoreResult<()> {
        let results = futures::future::join_all(self.inner.members.iter().map(|m| m.close())).await;
        results.into_iter().find(|r| r.is_err()).unwrap_or(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_hold_an_objects_member_up_to_their_limit_and_past_it_pin_nothing() {
        let mut pins = Pins::default();
        let (member, first) = pins.pin("c", b"o", 3);
        assert_eq!(member, 3);
        assert_eq!(pins.pin("c", b"o", 5).0, 3, "later units go where the first went");
        drop(first);
        assert_eq!(pins.pin("c", b"o", 5).0, 5, "a pin let go places anew");
        let held: Vec<Arc<()>> = (0..MAX_PINS).map(|i| pins.pin("c", format!("k{i}").as_bytes(), 1).1).collect();
        assert_eq!(pins.by_name.len(), MAX_PINS, "the let-go pin was forgotten at the limit");
        let (member, past) = pins.pin("c", b"past", 2);
        assert_eq!((member, pins.by_name.len()), (2, MAX_PINS), "past the limit nothing more is kept");
        assert_eq!(pins.pin("c", b"past", 4).0, 4, "an object pinned past the limit is not held");
        assert_eq!(pins.pin("c", b"k7", 0).0, 1, "those within it still are");
        drop(past);
        drop(held);
        assert_eq!(pins.pin("c", b"again", 6).0, 6);
        assert_eq!(pins.by_name.len(), 1, "every let-go pin forgotten once the limit is reached");
    }
}
