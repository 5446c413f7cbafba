//! Text from a BMC (answers, `ipmitool`'s output) is untrusted: it is only ever quoted in an
//! error message, through [`quote`], never interpreted or handed to a shell.

/// At most this many characters of BMC text go into a message.
pub const MAX_QUOTED: usize = 300;

/// `text` made safe to show: control characters (newlines included) become spaces, runs of
/// spaces one space, and it is cut at [`MAX_QUOTED`] characters with an ellipsis.
pub fn quote(text: &str) -> String {
    let mut out = String::new();
    let mut chars = 0usize;
    let mut space = false;
    for c in text.trim().chars() {
        let c = if c.is_control() { ' ' } else { c };
        if c == ' ' {
            if space {
                continue;
            }
            space = true;
        } else {
            space = false;
        }
        if chars == MAX_QUOTED {
            out.push('…');
            break;
        }
        out.push(c);
        chars += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_become_single_spaces_and_long_text_is_cut() {
        assert_eq!(quote("  a\r\n\tb\x1b[31m c  "), "a b [31m c");
        let long = "x".repeat(MAX_QUOTED + 10);
        let q = quote(&long);
        assert_eq!(q.chars().count(), MAX_QUOTED + 1);
        assert!(q.ends_with('…'));
        assert_eq!(quote(&"y".repeat(MAX_QUOTED)), "y".repeat(MAX_QUOTED));
    }
}
