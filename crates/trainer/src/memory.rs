//! Memory figures of a step: the process's peak resident memory (what a CPU run holds at most).

/// The peak resident set size of this process in GiB (Linux `VmHWM`), if the system says.
pub(crate) fn peak_rss_gb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_peak_covers_what_the_process_holds() {
        let held = vec![1u8; 64 << 20];
        let peak = super::peak_rss_gb().expect("Linux reports VmHWM");
        assert!(peak >= 64.0 / 1024.0, "{peak} GiB with 64 MiB held");
        assert_eq!(held[12345], 1);
    }
}
