//! A checker of single-key histories (issue 16): clients on several nodes write unique values to one key,
//! delete it and read it while nodes fail; the checker finds reads that no linearizable register could
//! return. Writes (and deletes) that failed may have taken effect or not, at any time after they began;
//! acknowledged ones took effect between their start and their end.
//!
//! What it refuses, for a read `r` of a value written by `w` (a read of nothing matches the initial state
//! or any delete):
//! - a read from the future: `w` began after `r` ended;
//! - a stale read: an acknowledged write began after the acknowledged `w` ended and ended before `r` began;
//! - a read going back in time: a read `r1` ended before `r` began and saw a value whose write began
//!   after the acknowledged `w` ended.
//!
//! These are necessary conditions of linearizability for a register with unique writes (what Jepsen's
//! Knossos decides in full); they catch lost acknowledged writes, resurrected deletes and stale replicas.
//! Write ids start at 1 and times after 0 (the initial state is id 0, at time 0).

/// One operation, with its times in nanoseconds from the history's start.
#[derive(Clone, Debug)]
pub struct Op {
    pub client: usize,
    pub start_ns: u64,
    /// None: the call failed (a write may or may not have taken effect).
    pub end_ns: Option<u64>,
    pub kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Wrote value `id` (unique in the history).
    Write(u64),
    /// Deleted the key (`id` unique among writes and deletes).
    Delete(u64),
    /// Read the value, or nothing.
    Read(Option<u64>),
}

/// The writes (and deletes) a read of `value` may have seen, as (start, end, id): a read of nothing may
/// also have seen the initial state (id 0, ended at time 0).
fn candidates(ops: &[Op], value: Option<u64>) -> Vec<(u64, Option<u64>, u64)> {
    let mut out = Vec::new();
    if value.is_none() {
        out.push((0, Some(0), 0));
    }
    out.extend(ops.iter().filter_map(|op| match (op.kind, value) {
        (Kind::Write(id), Some(v)) if id == v => Some((op.start_ns, op.end_ns, id)),
        (Kind::Delete(id), None) => Some((op.start_ns, op.end_ns, id)),
        _ => None,
    }));
    out
}

/// Checks `ops`; the error names the first read no register could return.
pub fn check(ops: &[Op]) -> Result<(), String> {
    // Acknowledged writes and deletes, as (start, end).
    let acked: Vec<(u64, u64, u64)> = ops
        .iter()
        .filter_map(|op| match (op.kind, op.end_ns) {
            (Kind::Write(id) | Kind::Delete(id), Some(end)) => Some((op.start_ns, end, id)),
            _ => None,
        })
        .collect();
    let reads: Vec<(&Op, Option<u64>, u64)> = ops
        .iter()
        .filter_map(|op| match (op.kind, op.end_ns) {
            (Kind::Read(v), Some(end)) => Some((op, v, end)),
            _ => None,
        })
        .collect();
    // For each read, the latest start among the writes it may have seen (the newest explanation).
    let mut seen_start = Vec::with_capacity(reads.len());
    for (op, value, end) in &reads {
        let fits = |(w_start, w_end, w_id): &(u64, Option<u64>, u64)| {
            let from_future = *w_start > *end;
            let stale =
                w_end.is_some_and(|w_end| acked.iter().any(|(s, e, id)| id != w_id && *s > w_end && *e < op.start_ns));
            !from_future && !stale
        };
        let Some(best) = candidates(ops, *value).into_iter().filter(fits).map(|(s, ..)| s).max() else {
            return Err(format!(
                "client {} read {value:?} in [{}, {end}] ns: no write explains it",
                op.client, op.start_ns
            ));
        };
        seen_start.push(best);
    }
    // Reads in real-time order never go back: a later read's value was not overwritten before an earlier
    // read's value was written.
    for (i, (r1, v1, end1)) in reads.iter().enumerate() {
        for (j, (r2, v2, _)) in reads.iter().enumerate() {
            if i == j || *end1 >= r2.start_ns {
                continue;
            }
            let w1_start = seen_start[i];
            // Every write r2 may have seen ended before r1's value was written.
            let older = candidates(ops, *v2).iter().all(|(_, w_end, _)| w_end.is_some_and(|e| e < w1_start));
            if older && v1 != v2 {
                return Err(format!(
                    "client {} read {v2:?} at {} ns after client {} had read the newer {v1:?} by {end1} ns",
                    r2.client, r2.start_ns, r1.client
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: usize, start_ns: u64, end_ns: Option<u64>, kind: Kind) -> Op {
        Op { client, start_ns, end_ns, kind }
    }

    #[test]
    fn a_concurrent_history_passes() {
        let ops = [
            op(0, 1, Some(10), Kind::Write(1)),
            op(1, 5, Some(8), Kind::Read(None)), // concurrent with the write: either is fine
            op(1, 9, Some(12), Kind::Read(Some(1))),
            op(0, 11, Some(20), Kind::Write(2)),
            op(1, 13, Some(15), Kind::Read(Some(1))),
            op(2, 14, None, Kind::Write(3)), // failed: may show up later, or never
            op(1, 21, Some(22), Kind::Read(Some(3))),
            op(0, 23, Some(30), Kind::Delete(4)),
            op(1, 31, Some(32), Kind::Read(None)),
        ];
        assert_eq!(check(&ops), Ok(()));
    }

    #[test]
    fn a_lost_write_a_read_from_the_future_and_a_resurrection_are_found() {
        let lost = [op(0, 1, Some(10), Kind::Write(1)), op(1, 11, Some(12), Kind::Read(None))];
        assert!(check(&lost).is_err());
        let future = [op(1, 1, Some(5), Kind::Read(Some(1))), op(0, 6, Some(10), Kind::Write(1))];
        assert!(check(&future).is_err());
        let resurrected = [
            op(0, 1, Some(10), Kind::Write(1)),
            op(0, 11, Some(20), Kind::Delete(2)),
            op(1, 21, Some(22), Kind::Read(Some(1))),
        ];
        assert!(check(&resurrected).is_err());
    }

    #[test]
    fn a_read_going_back_in_time_is_found() {
        let ops = [
            op(0, 1, Some(10), Kind::Write(1)),
            op(0, 11, Some(20), Kind::Write(2)),
            op(1, 12, Some(18), Kind::Read(Some(2))), // sees the write in flight
            op(2, 19, Some(21), Kind::Read(Some(1))), // ... but this later read does not
        ];
        let ok_alone = [ops[0].clone(), ops[1].clone(), ops[3].clone()];
        assert_eq!(check(&ok_alone), Ok(()), "without the earlier read, 1 is fine while 2 is in flight");
        assert!(check(&ops).is_err());
    }
}
