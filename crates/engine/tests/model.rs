//! Property test: random transaction sequences against an in-memory model; reads always agree, across
//! lazy sync and reopen, in both write modes.

mod common;

use common::*;
use mosaic_engine::*;
use proptest::prelude::*;

fn apply(d: &mut SimDrive, m: &mut Model, op: &ModelOp, cfg: &EngineConfig) {
    try_apply(d, m, op, cfg).unwrap();
}

fn run(ops: Vec<ModelOp>, cfg: EngineConfig) {
    let mut d = SimDrive::new(cfg.clone());
    let mut m = Model::new();
    for op in &ops {
        apply(&mut d, &mut m, op, &cfg);
        assert_matches_model(&d, &m);
    }
    d.engine().sync_fragments(true).unwrap();
    assert_matches_model(&d, &m);
    let report = d.engine().check().unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert!(d.engine().scrub(None).unwrap().damaged.is_empty());
    d.engine().close().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn fragment_log_agrees_with_model(ops in proptest::collection::vec(op_strategy(), 1..40)) {
        run(ops, config());
    }

    #[test]
    fn rmw_agrees_with_model(ops in proptest::collection::vec(op_strategy(), 1..25)) {
        run(ops, EngineConfig { write_mode: WriteMode::Rmw, ..config() });
    }
}

#[test]
fn background_lazy_sync_agrees_with_model() {
    let cfg = EngineConfig { lazy_sync: true, ..config() };
    let mut d = SimDrive::new(cfg.clone());
    let mut m = Model::new();
    for i in 0..400u64 {
        let op = ModelOp::Append { obj: (i % 3) as u8, len: 2048, seed: i };
        apply(&mut d, &mut m, &op, &cfg);
    }
    d.engine().sync_fragments(false).unwrap();
    assert_matches_model(&d, &m);
    assert!(d.engine().stats().rmw_in_lazy_sync > 0);
    assert_eq!(d.engine().stats().rmw_on_write_path, 0);
    assert!(d.engine().check().unwrap().is_clean());
}
