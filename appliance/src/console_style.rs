//! The console's design system: the stylesheet (`appliance/assets/console.css`), status
//! badges (a state's tone as colour, icon and its name: never colour alone) and human units
//! (IEC sizes, "3 min ago" with the exact time on hover). Pure: the time is passed in.

use maud::{Markup, html};

/// The stylesheet, inlined in every page (one request fewer; it is a few KB).
pub const STYLE: &str = include_str!("../assets/console.css");

/// How a state reads at a glance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tone {
    /// Where it should be.
    Ok,
    /// Working on it.
    Busy,
    /// Held, waiting for someone or something.
    Warn,
    /// Failed: someone should look.
    Bad,
    /// Nothing to do, or not started.
    Idle,
}

impl Tone {
    pub fn class(self) -> &'static str {
        match self {
            Tone::Ok => "tone-ok",
            Tone::Busy => "tone-busy",
            Tone::Warn => "tone-warn",
            Tone::Bad => "tone-bad",
            Tone::Idle => "tone-idle",
        }
    }
}

/// The tone of a state name, whichever record it comes from: a node's introspection, a
/// provisioning run, a sub, a power action, a rollout.
pub fn tone(state: &str) -> Tone {
    match state {
        "finished" | "synced" | "healthy" | "done" | "on" | "active" | "optimal" | "ok" => Tone::Ok,
        "error"
        | "unreachable"
        | "unsafe_update"
        | "not_enough_space"
        | "image_missing"
        | "missing_computed_file"
        | "failed"
        | "fail_stop"
        | "reverted" => Tone::Bad,
        "waiting" | "updates_disabled" | "disruption_denied" | "paused" | "queued" | "viable" => {
            Tone::Warn
        }
        "enrolling" | "processing" | "starting" | "polling" | "computing" | "fetching"
        | "updating" | "waiting_for_scan" | "asking_disruption" | "birth" | "rebirth" | "clean"
        | "rolling" | "canary" | "forward" => Tone::Busy,
        _ => Tone::Idle,
    }
}

/// A state as a badge: its tone's colour and icon (drawn by the stylesheet, so the text is
/// the state's name alone) and the name.
pub fn badge(state: &str) -> Markup {
    html! { span class={ "state badge " (tone(state).class()) " " (state) } { (state) } }
}

/// `n` bytes in IEC units: `512 B`, `1.5 KiB`, `7.8 GiB`, `500.0 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

/// How long before `now_ms` `then_ms` was: `just now`, `42 s ago`, `3 min ago`, `5 h ago`,
/// `2 d ago` (`in …` for a time ahead).
pub fn ago(now_ms: i64, then_ms: i64) -> String {
    let d = now_ms.saturating_sub(then_ms);
    let (secs, ahead) = if d < 0 {
        (d.unsigned_abs() / 1000, true)
    } else {
        (d.unsigned_abs() / 1000, false)
    };
    let text = match secs {
        0..=4 => return "just now".into(),
        5..=59 => format!("{secs} s"),
        60..=3599 => format!("{} min", secs / 60),
        3600..=86_399 => format!("{} h", secs / 3600),
        _ => format!("{} d", secs / 86_400),
    };
    if ahead {
        format!("in {text}")
    } else {
        format!("{text} ago")
    }
}

/// A time as [`ago`], with the exact UTC time on hover and for machines (`<time>`).
pub fn when(now_ms: i64, then_ms: i64) -> Markup {
    let exact = paddock_inspector::node::iso(then_ms.div_euclid(1000));
    html! { time datetime=(exact) title={ (exact) " UTC" } { (ago(now_ms, then_ms)) } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_have_tones_and_badges_say_their_name() {
        for (state, want) in [
            ("synced", Tone::Ok),
            ("finished", Tone::Ok),
            ("error", Tone::Bad),
            ("missing_computed_file", Tone::Bad),
            ("disruption_denied", Tone::Warn),
            ("fetching", Tone::Busy),
            ("birth", Tone::Busy),
            ("no_image", Tone::Idle),
            ("something-new", Tone::Idle),
        ] {
            assert_eq!(tone(state), want, "{state}");
        }
        assert_eq!(
            badge("synced").into_string(),
            r#"<span class="state badge tone-ok synced">synced</span>"#
        );
        assert_eq!(
            badge("<x>").into_string(),
            r#"<span class="state badge tone-idle &lt;x&gt;">&lt;x&gt;</span>"#
        );
    }

    #[test]
    fn human_units() {
        for (n, want) in [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (1536, "1.5 KiB"),
            (8 << 30, "8.0 GiB"),
            (500 << 30, "500.0 GiB"),
            (3 << 40, "3.0 TiB"),
        ] {
            assert_eq!(bytes(n), want, "{n}");
        }
        let now = 1_000_000_000;
        for (then, want) in [
            (now, "just now"),
            (now - 42_000, "42 s ago"),
            (now - 3 * 60_000 - 5_000, "3 min ago"),
            (now - 5 * 3_600_000, "5 h ago"),
            (now - 2 * 86_400_000, "2 d ago"),
            (now + 90_000, "in 1 min"),
        ] {
            assert_eq!(ago(now, then), want, "{then}");
        }
        let t = when(now, now - 60_000).into_string();
        assert!(
            t.starts_with("<time datetime=\"1970-01-12T13:45:40\""),
            "{t}"
        );
        assert!(t.ends_with(">1 min ago</time>"), "{t}");
    }

    /// WCAG 2's relative luminance of `#rrggbb`.
    fn luminance(hex: &str) -> f64 {
        let c = |i: usize| {
            let v = f64::from(u8::from_str_radix(&hex[i..i + 2], 16).unwrap()) / 255.0;
            if v <= 0.03928 {
                v / 12.92
            } else {
                ((v + 0.055) / 1.055).powf(2.4)
            }
        };
        0.2126 * c(1) + 0.7152 * c(3) + 0.0722 * c(5)
    }

    /// The value of `--name` in `block` (the first after the block's start).
    fn var<'a>(block: &'a str, name: &str) -> &'a str {
        let at = block
            .find(&format!("--{name}:"))
            .unwrap_or_else(|| panic!("--{name}"));
        let rest = &block[at + name.len() + 3..];
        &rest.trim_start()[..7]
    }

    /// Every tone's text on its background, and the page's text and links on the page,
    /// reach WCAG AA (4.5:1) in the light and the dark scheme.
    #[test]
    fn every_tone_passes_wcag_aa_in_both_schemes() {
        let dark_at = STYLE.find("prefers-color-scheme: dark").unwrap();
        for (scheme, block) in [("light", &STYLE[..dark_at]), ("dark", &STYLE[dark_at..])] {
            for tone in ["ok", "busy", "warn", "bad", "idle"] {
                let (fg, bg) = (
                    var(block, &format!("{tone}-fg")),
                    var(block, &format!("{tone}-bg")),
                );
                let (a, b) = (luminance(fg), luminance(bg));
                let ratio = (a.max(b) + 0.05) / (a.min(b) + 0.05);
                assert!(
                    ratio >= 4.5,
                    "{scheme} {tone}: {fg} on {bg} is {ratio:.2}:1"
                );
            }
            for text in ["fg", "muted", "link"] {
                let (a, b) = (luminance(var(block, text)), luminance(var(block, "bg")));
                let ratio = (a.max(b) + 0.05) / (a.min(b) + 0.05);
                assert!(ratio >= 4.5, "{scheme} {text} on the page: {ratio:.2}:1");
            }
        }
    }
}
