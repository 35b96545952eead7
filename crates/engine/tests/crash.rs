//! Crash tests on the simulated device: random operations, a power loss at a random IO, reopen, and check
//! that every acknowledged transaction is there, nothing unacknowledged is partly there, every block passes
//! its checksum, and no block is leaked or doubly used.
//!
//! MOSAIC_CRASH_POINTS sets the number of crash points (default 1000; the long mode runs 100000).

mod common;

use common::*;
use mosaic_engine::*;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

#[test]
fn crash_at_random_points() {
    let points: u64 = std::env::var("MOSAIC_CRASH_POINTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let seed: u64 = std::env::var("MOSAIC_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(7);
    let cfg = config();
    let mut d = SimDrive::new(cfg.clone());
    let mut m = Model::new();
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes));
    let strategy = op_strategy();
    let mut crashed_mid_op = 0;
    for point in 0..points {
        let pick = |runner: &mut TestRunner, n: u64| -> u64 { (0..n).new_tree(runner).unwrap().current() };
        let countdown = pick(&mut runner, 12);
        let mode = if pick(&mut runner, 2) == 0 {
            CrashMode::DropUnflushed
        } else {
            CrashMode::TearOne { seed: pick(&mut runner, 1 << 20) }
        };
        d.device.arm_crash(countdown, mode);
        let ops = pick(&mut runner, 12) + 1;
        for _ in 0..ops {
            let op = strategy.new_tree(&mut runner).unwrap().current();
            if matches!(op, ModelOp::Reopen) {
                continue;
            }
            if try_apply(&mut d, &mut m, &op, &cfg).is_err() {
                crashed_mid_op += 1;
                break;
            }
        }
        // Power loss now if the armed one did not fire.
        d.device.crash(mode);
        if let Some(e) = d.engine.take() {
            let _ = e.close();
        }
        d.device.revive();
        d.reopen_result(cfg.clone()).unwrap_or_else(|e| panic!("reopen after crash point {point} failed: {e}"));
        assert_matches_model(&d, &m);
        let report = d.engine().check().unwrap();
        assert!(report.is_clean(), "crash point {point}: {report:?}");
        if point % 50 == 0 {
            let scrub = d.engine().scrub(None).unwrap();
            assert!(scrub.damaged.is_empty(), "crash point {point}: {scrub:?}");
        }
        // Keep the drive from filling up: start over with a fresh model now and then.
        if m.values().map(|v| v.len()).sum::<usize>() > 8 << 20 {
            for name in m.keys().cloned().collect::<Vec<_>>() {
                d.engine().submit(Transaction::new().op(Op::Remove { coll: d.coll, name })).unwrap();
            }
            m.clear();
        }
    }
    assert!(crashed_mid_op > points / 4, "only {crashed_mid_op} of {points} crashes hit an operation");
    let scrub = d.engine().scrub(None).unwrap();
    assert!(scrub.damaged.is_empty(), "{scrub:?}");
}
