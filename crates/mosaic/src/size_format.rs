//! Human sizes on the command line and in configuration: "4096", "4KiB", "64MiB", "16GiB", "1TiB"
//! (also KB/MB/GB/TB and K/M/G/T, all binary multiples).

pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("invalid size {s:?}: expected a number with an optional unit such as 64MiB"));
    }
    let n: u64 = num.parse().map_err(|_| format!("invalid size {s:?}: number too large"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(format!("invalid size {s:?}: unknown unit {other:?} (use KiB, MiB, GiB or TiB)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("invalid size {s:?}: too large"))
}

pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, m) in UNITS {
        if bytes >= m {
            return format!("{:.1} {name}", bytes as f64 / m as f64);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size(" 1 TiB "), Ok(1 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("18446744073709551615KiB").is_err());
        assert_eq!(format_size(1536), "1.5 KiB");
    }
}
