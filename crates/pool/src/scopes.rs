//! Scopes: parts of a pool's objects placed on some members only (a microstore's sets, paper 002). A scope
//! is the objects of one collection whose names begin with a prefix; its objects live on its members, each
//! on the member its locator hashes to among them (`member_of` over the scope's members, in their order).
//! Objects outside every scope are placed the same way among the pool's home members (`Home`: every
//! member unless a microstore keeps its sets to itself); objects with an empty locator live on member 0.
//!
//! A scope that changes members moves: while `moving_from` names the members it had, an object may still
//! be on its member there, so reads ask the new member, then the old one, then the new one again (an object
//! moved between the first two asks is on the new member by the third: a move copies before it removes);
//! writes move the objects they touch first (`crate::moving`).

use crate::member_of;
use mosaic_store::{ErrorKind, StoreError, StoreResult, locator};
use std::collections::{BTreeMap, HashMap};

/// Most scopes a pool has (two per bucket placed by a microstore).
pub const MAX_SCOPES: usize = 8192;

/// Objects of collection `coll` whose names begin with `prefix`, on `members`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    pub coll: String,
    pub prefix: Vec<u8>,
    /// The members its objects live on (each object on the one its locator hashes to among them).
    pub members: Vec<usize>,
    /// While its objects move to `members`: the members they lived on before.
    pub moving_from: Option<Vec<usize>>,
}

/// Where the objects outside every scope live: on `members` (each on the one its locator hashes to among
/// them), and while they move there, on `moving_from` before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Home {
    pub members: Vec<usize>,
    pub moving_from: Option<Vec<usize>>,
}

impl Home {
    /// Every member of a pool of `members`, not moving.
    pub fn all(members: usize) -> Home {
        Home { members: (0..members).collect(), moving_from: None }
    }
}

/// Where an object is placed: its member, and while its scope moves, the member it may still be on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) now: usize,
    /// The member it lived on before its scope moved, when that is another one.
    pub(crate) before: Option<usize>,
}

/// The pool's placement: its member count and its scopes, validated.
#[derive(Debug)]
pub(crate) struct Placement {
    members: usize,
    home: Home,
    scopes: Vec<Scope>,
    /// Per collection, its scopes' indexes by prefix (no prefix of a collection begins another).
    by_coll: HashMap<String, BTreeMap<Vec<u8>, usize>>,
}

impl Placement {
    /// Every object over all `members`.
    pub(crate) fn flat(members: usize) -> Self {
        Placement { members, home: Home::all(members), scopes: Vec::new(), by_coll: HashMap::new() }
    }

    pub(crate) fn new(members: usize, home: Home, scopes: Vec<Scope>) -> StoreResult<Self> {
        let invalid = |why: String| Err(StoreError::new(ErrorKind::InvalidArgument, why));
        if scopes.len() > MAX_SCOPES {
            return invalid(format!("{} scopes; a pool has at most {MAX_SCOPES}", scopes.len()));
        }
        let valid = |list: &Vec<usize>| {
            let sorted_unique = list.windows(2).all(|w| w[0] < w[1]);
            !list.is_empty() && sorted_unique && list.iter().all(|m| *m < members)
        };
        if let Some(list) = std::iter::once(&home.members).chain(home.moving_from.as_ref()).find(|l| !valid(l)) {
            return invalid(format!(
                "the home names members {list:?}: give 1 to {members} members below {members}, ascending"
            ));
        }
        let mut by_coll: HashMap<String, BTreeMap<Vec<u8>, usize>> = HashMap::new();
        for (i, s) in scopes.iter().enumerate() {
            for list in std::iter::once(&s.members).chain(s.moving_from.as_ref()) {
                if !valid(list) {
                    return invalid(format!(
                        "scope {}/{} names members {list:?}: give 1 to {members} members below {members}, ascending",
                        s.coll,
                        s.prefix.escape_ascii()
                    ));
                }
            }
            let prefixes = by_coll.entry(s.coll.clone()).or_default();
            let clash = prefixes.keys().find(|p| p.starts_with(&s.prefix) || s.prefix.starts_with(p));
            if let Some(p) = clash {
                return invalid(format!(
                    "scopes {}/{} and {}/{} overlap",
                    s.coll,
                    p.escape_ascii(),
                    s.coll,
                    s.prefix.escape_ascii()
                ));
            }
            prefixes.insert(s.prefix.clone(), i);
        }
        Ok(Placement { members, home, scopes, by_coll })
    }

    pub(crate) fn scopes(&self) -> &[Scope] {
        &self.scopes
    }

    pub(crate) fn home(&self) -> Home {
        self.home.clone()
    }

    /// The scope of object `name` of collection `coll`, if any.
    pub(crate) fn scope_of(&self, coll: &str, name: &[u8]) -> Option<&Scope> {
        let prefixes = self.by_coll.get(coll)?;
        // Prefixes of one collection do not begin one another, so the only one that can begin `name` is
        // the greatest at or below it.
        use std::ops::Bound;
        let (prefix, i) = prefixes.range::<[u8], _>((Bound::Unbounded, Bound::Included(name))).next_back()?;
        name.starts_with(prefix).then(|| &self.scopes[*i])
    }

    /// Where object `name` of collection `coll` lives.
    pub(crate) fn place(&self, coll: &str, name: &[u8]) -> Placed {
        let loc = locator(name);
        if loc.is_empty() {
            return Placed { now: member_of(loc, self.members), before: None };
        }
        let (members, moving_from) = match self.scope_of(coll, name) {
            Some(scope) => (&scope.members, scope.moving_from.as_ref()),
            None => (&self.home.members, self.home.moving_from.as_ref()),
        };
        let now = among(members, loc);
        let before = moving_from.map(|from| among(from, loc)).filter(|b| *b != now);
        debug_assert!(now < self.members && before.is_none_or(|b| b < self.members));
        Placed { now, before }
    }

    /// Whether any scope, or the home, is moving.
    pub(crate) fn any_moving(&self) -> bool {
        self.scopes.iter().any(|s| s.moving_from.is_some()) || self.home.moving_from.is_some()
    }
}

/// The member of `members` that objects of `locator` live on.
fn among(members: &[usize], locator: &[u8]) -> usize {
    members[member_of(locator, members.len())]
}

#[cfg(test)]
mod tests {
    use super::*;
    use mosaic_store::with_locator;

    fn scope(coll: &str, prefix: &str, members: &[usize], from: Option<&[usize]>) -> Scope {
        Scope {
            coll: coll.into(),
            prefix: prefix.as_bytes().to_vec(),
            members: members.to_vec(),
            moving_from: from.map(<[usize]>::to_vec),
        }
    }

    #[test]
    fn objects_of_a_scope_live_on_its_members_and_others_over_all() {
        let p = Placement::new(
            4,
            Home::all(4),
            vec![scope("b/small", "", &[2, 3], None), scope("mpu", "small/", &[2, 3], Some(&[0, 1, 2, 3]))],
        )
        .unwrap();
        for i in 0..200 {
            let key = format!("k{i}");
            let small = p.place("b/small", key.as_bytes());
            assert!([2, 3].contains(&small.now) && small.before.is_none());
            assert_eq!(small.now, [2, 3][member_of(key.as_bytes(), 2)]);
            let other = p.place("b/other", key.as_bytes());
            assert_eq!(other, Placed { now: member_of(key.as_bytes(), 4), before: None });
            let part = with_locator(format!("small/u1/{i:05}").as_bytes(), key.as_bytes());
            let placed = p.place("mpu", &part);
            assert_eq!(placed.now, small.now, "a part lives with its object");
            let was = member_of(key.as_bytes(), 4);
            assert_eq!(placed.before, (was != placed.now).then_some(was));
            let other_part = with_locator(format!("smallish/u1/{i:05}").as_bytes(), key.as_bytes());
            assert_eq!(p.place("mpu", &other_part).now, member_of(key.as_bytes(), 4));
        }
        assert_eq!(p.place("b/small", &with_locator(b"record", b"")).now, 0, "an empty locator is home");
        assert!(p.any_moving());
    }

    #[test]
    fn objects_outside_every_scope_live_on_the_home_members() {
        let home = Home { members: vec![0, 3], moving_from: Some(vec![0, 1, 2, 3]) };
        let p = Placement::new(4, home.clone(), vec![scope("b/small", "", &[1, 2], None)]).unwrap();
        assert_eq!(p.home(), home);
        assert!(p.any_moving(), "the home moves");
        for i in 0..200 {
            let key = format!("k{i}");
            let placed = p.place("b/other", key.as_bytes());
            assert_eq!(placed.now, [0, 3][member_of(key.as_bytes(), 2)]);
            let was = member_of(key.as_bytes(), 4);
            assert_eq!(placed.before, (was != placed.now).then_some(was));
            assert_eq!(p.place("b/small", key.as_bytes()).now, [1, 2][member_of(key.as_bytes(), 2)], "scoped");
        }
        assert_eq!(p.place("b/other", &with_locator(b"record", b"")).now, 0, "an empty locator stays on 0");
        let settled = Placement::new(4, Home { members: vec![3], moving_from: None }, vec![]).unwrap();
        assert!(!settled.any_moving());
        assert_eq!(settled.place("c", b"anything").now, 3);
        for bad in [vec![], vec![4], vec![2, 1], vec![1, 1]] {
            let moving = Home { members: vec![1], moving_from: Some(bad.clone()) };
            assert!(Placement::new(4, moving, vec![]).is_err(), "{bad:?}");
            assert!(Placement::new(4, Home { members: bad.clone(), moving_from: None }, vec![]).is_err());
        }
    }

    #[test]
    fn bad_scopes_are_refused() {
        let bad = [
            vec![scope("c", "", &[], None)],
            vec![scope("c", "", &[1, 0], None)],
            vec![scope("c", "", &[1, 1], None)],
            vec![scope("c", "", &[4], None)],
            vec![scope("c", "", &[1], Some(&[]))],
            vec![scope("c", "a/", &[1], None), scope("c", "a/b", &[2], None)],
            vec![scope("c", "", &[1], None), scope("c", "x", &[2], None)],
            vec![scope("c", "a", &[1], None), scope("c", "a", &[2], None)],
        ];
        for scopes in bad {
            assert!(Placement::new(4, Home::all(4), scopes.clone()).is_err(), "{scopes:?}");
        }
        let many = (0..=MAX_SCOPES).map(|i| scope("c", &format!("{i:05}/"), &[0], None)).collect();
        assert!(Placement::new(4, Home::all(4), many).unwrap_err().message.contains("at most"));
        let at_limit = (0..MAX_SCOPES).map(|i| scope("c", &format!("{i:05}/"), &[0], None)).collect();
        let p = Placement::new(4, Home::all(4), at_limit).unwrap();
        assert_eq!(p.scope_of("c", b"00017/x").map(|s| s.prefix.clone()), Some(b"00017/".to_vec()));
        assert!(p.scope_of("c", b"00017").is_none());
        assert!(p.scope_of("d", b"00017/x").is_none());
    }
}
