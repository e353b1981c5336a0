//! Unit tests of the election's configuration and timings.

use super::elector::jittered;
use super::*;

#[test]
fn agentk_names_its_lease_after_the_agent() {
    let c = LeaderConfig::for_agent("gitlab-agent", 42, "agentk-7d9f-abc");
    assert_eq!(c.lease_name, "agent-42-lock");
    assert_eq!(c.describe(), "gitlab-agent/agent-42-lock");
    assert_eq!(c.lease_seconds(), 15);
    c.validate().unwrap();
}

#[test]
fn validation_names_every_bad_field() {
    let mut c = LeaderConfig::for_agent("", 1, "");
    c.lease_duration = Duration::from_secs(5);
    c.renew_deadline = Duration::from_secs(5);
    c.retry_period = Duration::from_secs(5);
    let Err(Error::Invalid(bad)) = c.validate() else {
        panic!("accepted")
    };
    let text = bad.join("\n");
    for field in ["namespace", "identity", "lease_duration", "renew_deadline"] {
        assert!(text.contains(field), "{field} not named in {text}");
    }
    assert!(!text.contains("lease_name"));
}

#[test]
fn short_durations_round_up_to_a_second() {
    let mut c = LeaderConfig::for_agent("ns", 1, "a");
    c.lease_duration = Duration::from_millis(1500);
    assert_eq!(c.lease_seconds(), 2);
    c.lease_duration = Duration::from_millis(200);
    assert_eq!(c.lease_seconds(), 1);
}

#[test]
fn jitter_stays_within_the_factor() {
    let p = Duration::from_millis(100);
    for _ in 0..100 {
        let j = jittered(p);
        assert!(j >= p && j <= p.mul_f64(1.0 + JITTER_FACTOR), "{j:?}");
    }
}
