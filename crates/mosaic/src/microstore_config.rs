//! The `[microstores]` table of the config file: the workload monitor's window and classes, the resource
//! manager's workers and steps, the default microstore's target. Every key is optional; a user who sets
//! nothing gets one default microstore holding every worker, and nothing changes for them.

use mosaic::size_format::parse_size;
use mosaic_microstore::manager::Target;
use mosaic_microstore::registry::Config as MicrostoresConfig;
use serde::Deserialize;
use std::time::Duration;

#[derive(Deserialize, Default, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MicrostoresFile {
    /// The length of one window slot (a round runs once per slot), e.g. "5s".
    pub window_slot: Option<String>,
    pub window_slots: Option<usize>,
    pub max_buckets: Option<usize>,
    pub small_max_size: Option<String>,
    pub large_min_size: Option<String>,
    pub heavy_share_min: Option<f64>,
    pub share_band: Option<f64>,
    pub min_requests: Option<u64>,
    pub hold_evaluations: Option<u32>,
    pub workers: Option<u32>,
    pub floor_workers: Option<u32>,
    pub shrink_step_workers: Option<u32>,
    pub grow_start_workers: Option<u32>,
    pub slack_ratio: Option<f64>,
    pub busy_min: Option<f64>,
    pub default_target_p99_ms: Option<f64>,
    pub max_waiting: Option<u32>,
    pub max_wait: Option<String>,
    pub adapt: Option<bool>,
    /// How much a large microstore's bandwidth cap comes down per round while a small one misses its
    /// target (per second), e.g. "32MiB".
    pub bandwidth_step: Option<String>,
    /// Off: requests are not admitted through microstores nor watched (the ablation of their cost).
    pub enabled: Option<bool>,
    /// Bytes per second a bucket's objects move between sets when its microstore changes, e.g. "64MiB".
    pub move_rate: Option<String>,
    /// Whether the resource manager moves erasure sets between microstores that own sets (on by default).
    pub move_sets: Option<bool>,
    /// Rounds in a row a microstore misses its target (and a donor has slack) before a set moves to it.
    pub set_patience_rounds: Option<u32>,
    /// Rounds after a set move before the next (besides waiting until the buckets' data moved).
    pub set_cooldown_rounds: Option<u32>,
    /// Sets a microstore that owns sets keeps at least.
    pub set_floor: Option<u32>,
    /// Whether drives schedule their IO by microstore (on by default; only with two or more microstores).
    pub io_shares: Option<bool>,
    /// A new microstore's points of drive IO (of 10000), its floor, and the step they move by.
    pub io_start_points: Option<u32>,
    pub io_floor_points: Option<u32>,
    pub io_step_points: Option<u32>,
    /// The weight of work no microstore asked for (moves, heal, upkeep).
    pub io_unshared_points: Option<u32>,
    /// Device bytes a drive lets be in flight before IO waits its turn by share, e.g. "8MiB".
    pub io_in_flight: Option<String>,
    /// The nice of the bulk CPU class (microstores judged on throughput beside one judged on latency);
    /// 0: none.
    pub bulk_nice: Option<i32>,
}

/// The default pace of a bucket's move between sets.
pub const DEFAULT_MOVE_RATE_BYTES_S: u64 = 64 << 20;

/// Bytes per second a bucket's move copies: 1 MiB to 64 GiB.
pub fn move_rate_bytes_s(file: Option<&MicrostoresFile>) -> Result<u64, String> {
    let Some(v) = file.and_then(|f| f.move_rate.as_ref()) else { return Ok(DEFAULT_MOVE_RATE_BYTES_S) };
    let rate = size("move_rate", v)?;
    if !((1 << 20)..=(64 << 30)).contains(&rate) {
        return Err(format!("microstores.move_rate: {v} is not between 1MiB and 64GiB (per second)"));
    }
    Ok(rate)
}

fn duration(name: &str, v: &str) -> Result<Duration, String> {
    humantime::parse_duration(v).map_err(|e| format!("microstores.{name}: {v:?} is not a duration such as 5s: {e}"))
}

fn size(name: &str, v: &str) -> Result<u64, String> {
    parse_size(v).map_err(|e| format!("microstores.{name}: {e}"))
}

/// Whether requests go through microstores at all (on unless `enabled = false`).
pub fn enabled(file: Option<&MicrostoresFile>) -> bool {
    file.and_then(|f| f.enabled).unwrap_or(true)
}

pub fn resolve(file: Option<&MicrostoresFile>) -> Result<MicrostoresConfig, String> {
    let mut c = MicrostoresConfig::default();
    let Some(f) = file else { return Ok(c) };
    let m = &mut c.monitor;
    if let Some(v) = &f.window_slot {
        m.window.slot_ms = duration("window_slot", v)?.as_millis() as u64;
    }
    m.window.slots = f.window_slots.unwrap_or(m.window.slots);
    m.max_buckets = f.max_buckets.unwrap_or(m.max_buckets);
    if let Some(v) = &f.small_max_size {
        m.classify.small_max_size_bytes = size("small_max_size", v)?;
    }
    if let Some(v) = &f.large_min_size {
        m.classify.large_min_size_bytes = size("large_min_size", v)?;
    }
    m.classify.heavy_share_min = f.heavy_share_min.unwrap_or(m.classify.heavy_share_min);
    m.classify.share_band = f.share_band.unwrap_or(m.classify.share_band);
    m.classify.min_requests = f.min_requests.unwrap_or(m.classify.min_requests);
    m.classify.hold_evaluations = f.hold_evaluations.unwrap_or(m.classify.hold_evaluations);
    let r = &mut c.manager;
    r.total_workers = f.workers.unwrap_or(r.total_workers);
    r.floor_workers = f.floor_workers.unwrap_or(r.floor_workers);
    r.shrink_step_workers = f.shrink_step_workers.unwrap_or(r.shrink_step_workers);
    r.grow_start_workers = f.grow_start_workers.unwrap_or(r.grow_start_workers);
    r.slack_ratio = f.slack_ratio.unwrap_or(r.slack_ratio);
    r.busy_min = f.busy_min.unwrap_or(r.busy_min);
    if let Some(ms) = f.default_target_p99_ms {
        c.default_target = Target::LatencyMsP99(ms);
    }
    c.max_waiting = f.max_waiting.unwrap_or(c.max_waiting);
    if let Some(v) = &f.max_wait {
        c.max_wait = duration("max_wait", v)?;
    }
    c.adapt = f.adapt.unwrap_or(c.adapt);
    if let Some(v) = &f.bandwidth_step {
        c.bandwidth.step_mib_s = size("bandwidth_step", v)? as f64 / (1u64 << 20) as f64;
    }
    let sets = &mut c.sets;
    sets.enabled = f.move_sets.unwrap_or(sets.enabled);
    sets.patience_rounds = f.set_patience_rounds.unwrap_or(sets.patience_rounds);
    sets.cooldown_rounds = f.set_cooldown_rounds.unwrap_or(sets.cooldown_rounds);
    sets.floor_sets = f.set_floor.unwrap_or(sets.floor_sets);
    let io = &mut c.io;
    io.enabled = f.io_shares.unwrap_or(io.enabled);
    io.start_points = f.io_start_points.unwrap_or(io.start_points);
    io.floor_points = f.io_floor_points.unwrap_or(io.floor_points);
    io.step_points = f.io_step_points.unwrap_or(io.step_points);
    io.unshared_points = f.io_unshared_points.unwrap_or(io.unshared_points);
    if let Some(v) = &f.io_in_flight {
        io.in_flight_max_bytes = size("io_in_flight", v)?;
    }
    c.bulk_nice = f.bulk_nice.unwrap_or(c.bulk_nice);
    if !(0..=mosaic_store::MAX_BULK_NICE).contains(&c.bulk_nice) {
        return Err(format!("microstores: bulk_nice is 0 to {}, not {}", mosaic_store::MAX_BULK_NICE, c.bulk_nice));
    }
    c.io.validate().map_err(|e| format!("microstores: {e}"))?;
    c.sets.validate().map_err(|e| format!("microstores: {e}"))?;
    c.bandwidth.validate().map_err(|e| format!("microstores: {e}"))?;
    c.monitor.validate().map_err(|e| format!("microstores: {e}"))?;
    c.manager.validate().map_err(|e| format!("microstores: {e}"))?;
    if c.max_waiting > 1 << 20 || c.max_wait.is_zero() || c.max_wait > Duration::from_secs(600) {
        return Err("microstores: max_waiting is at most 1048576 and max_wait between 1 ms and 600 s".into());
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_set_is_the_default_and_keys_are_checked() {
        assert_eq!(resolve(None).unwrap(), MicrostoresConfig::default());
        let f: MicrostoresFile = toml::from_str("window_slot = \"1s\"\nworkers = 64\nadapt = false").unwrap();
        let c = resolve(Some(&f)).unwrap();
        assert_eq!((c.monitor.window.slot_ms, c.manager.total_workers, c.adapt), (1_000, 64, false));
        let f: MicrostoresFile =
            toml::from_str("move_sets = false\nset_patience_rounds = 10000\nset_floor = 2").unwrap();
        let c = resolve(Some(&f)).unwrap();
        assert_eq!((c.sets.enabled, c.sets.patience_rounds, c.sets.floor_sets), (false, 10_000, 2));
        let f: MicrostoresFile =
            toml::from_str("io_shares = false\nio_step_points = 50\nio_in_flight = \"4MiB\"").unwrap();
        let c = resolve(Some(&f)).unwrap();
        assert_eq!((c.io.enabled, c.io.step_points, c.io.in_flight_max_bytes), (false, 50, 4 << 20));
        for (text, want) in [("bulk_nice = 0", 0), ("bulk_nice = 19", 19), ("adapt = true", 10)] {
            let f: MicrostoresFile = toml::from_str(text).unwrap();
            assert_eq!(resolve(Some(&f)).unwrap().bulk_nice, want, "{text}");
        }
        for bad in [
            "bulk_nice = -1",
            "bulk_nice = 20",
            "io_floor_points = 0",
            "io_floor_points = 200",
            "io_in_flight = \"1KiB\"",
            "io_in_flight = \"2GiB\"",
            "io_unshared_points = 2000000",
            "workers = 0",
            "window_slot = \"0s\"",
            "slack_ratio = 2.0",
            "max_wait = \"1h\"",
            "small_max_size = \"2MiB\"",
            "bandwidth_step = \"1KiB\"",
            "set_patience_rounds = 0",
            "set_cooldown_rounds = 10001",
            "set_floor = 0",
        ] {
            let f: MicrostoresFile = toml::from_str(bad).unwrap();
            assert!(resolve(Some(&f)).unwrap_err().starts_with("microstores"), "{bad}");
        }
        assert!(toml::from_str::<MicrostoresFile>("wrokers = 3").is_err());
        assert_eq!(move_rate_bytes_s(None).unwrap(), DEFAULT_MOVE_RATE_BYTES_S);
        for (text, want) in [("move_rate = \"1MiB\"", Ok(1 << 20)), ("move_rate = \"64GiB\"", Ok(64 << 30))] {
            let f: MicrostoresFile = toml::from_str(text).unwrap();
            assert_eq!(move_rate_bytes_s(Some(&f)), want);
        }
        for bad in ["move_rate = \"1023KiB\"", "move_rate = \"65GiB\"", "move_rate = \"fast\""] {
            let f: MicrostoresFile = toml::from_str(bad).unwrap();
            assert!(move_rate_bytes_s(Some(&f)).unwrap_err().starts_with("microstores.move_rate"), "{bad}");
        }
    }
}
