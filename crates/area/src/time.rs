//! Wall-clock time as Cairn keeps it: signed nanoseconds since the Unix epoch (UTC), and
//! the calendar fields of such a time (the `time` crate's proleptic Gregorian calendar)
//! for the daemon log's timestamps and the CLI's listings.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
pub use time::OffsetDateTime;

/// Now, in nanoseconds since the Unix epoch.
pub fn now_ns() -> i64 {
    from_system_time(SystemTime::now())
}

/// The time of the clock's last tick (`CLOCK_REALTIME_COARSE`: a few milliseconds
/// behind at most, read without touching the clock source), in nanoseconds since the
/// Unix epoch.
pub fn coarse_now_ns() -> i64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
    t.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec)
}

/// The resolution of [`coarse_now_ns`]: the clock's tick.
fn tick_ns() -> i64 {
    static TICK: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *TICK.get_or_init(|| {
        let t = rustix::time::clock_getres(rustix::time::ClockId::RealtimeCoarse);
        (t.tv_sec.saturating_mul(1_000_000_000) + t.tv_nsec).clamp(1, 1_000_000_000)
    })
}

/// The modification and change time a change to a file whose times are at most `old`
/// gets, without a read of the fine clock on the write path: the last clock tick when
/// that is later than `old` (what Linux's file systems store); else, when `old` was set
/// since that tick (an earlier change in the same tick), `old` plus 1 ns, so that every
/// change moves the times, as Linux's multigrain timestamps ensure (it cannot pass the
/// real time: each change takes more than a nanosecond); else (`old` in the future, set
/// by `utimensat`) the fine clock.
pub fn change_time_ns(old: i64) -> i64 {
    let coarse = coarse_now_ns();
    if coarse > old {
        coarse
    } else if old < coarse.saturating_add(tick_ns()) {
        old + 1
    } else {
        now_ns()
    }
}

/// A `SystemTime` in nanoseconds since the Unix epoch (saturating).
pub fn from_system_time(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_nanos())
            .map(|v| -v)
            .unwrap_or(i64::MIN),
    }
}

/// Nanoseconds since the Unix epoch as a `SystemTime`.
pub fn to_system_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// The UTC date and time of `ns` (every `i64` is within the calendar's range).
pub fn utc(ns: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(ns as i128).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// `YYYY-MM-DD{sep}HH:MM:SS` (UTC) of `ns`: the daemon log's timestamps (`T`) and the
/// CLI's listings (a space) add their own fraction and zone.
pub fn date_time(ns: i64, sep: char) -> String {
    let t = utc(ns);
    format!(
        "{:04}-{:02}-{:02}{sep}{:02}:{:02}:{:02}",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_calendar() {
        for ns in [0, 1, -1, 1_700_000_000_123_456_789, i64::MIN, i64::MAX] {
            assert_eq!(from_system_time(to_system_time(ns)), ns);
        }
        let t = utc(951_782_400 * 1_000_000_000);
        assert_eq!((t.year(), t.month() as u8, t.day()), (2000, 2, 29));
        let t = utc(-1);
        assert_eq!(
            (t.year(), t.hour(), t.nanosecond()),
            (1969, 23, 999_999_999)
        );
        assert_eq!(utc(i64::MIN).year(), 1677);
        assert_eq!(utc(i64::MAX).year(), 2262);
        assert_eq!(date_time(-1, 'T'), "1969-12-31T23:59:59");
    }

    #[test]
    fn change_times_move_forward() {
        let before = now_ns();
        let coarse = coarse_now_ns();
        // The last tick: not after now, and not far behind (a tick is at most 10 ms).
        assert!(coarse <= now_ns() && before - coarse < 100_000_000);
        // Times older than the last tick get it; a time at or after it gets the fine
        // clock, which is later than a time read before.
        let (c1, x, c2) = (coarse_now_ns(), change_time_ns(i64::MIN), coarse_now_ns());
        assert!(c1 <= x && x <= c2);
        // A time since the last tick: moved by a nanosecond.
        let t = coarse_now_ns();
        let x = change_time_ns(t);
        assert!(x == t + 1 || x > t && coarse_now_ns() > t);
        let future = now_ns() + 3_600_000_000_000;
        assert!(change_time_ns(future) < future);
    }
}
