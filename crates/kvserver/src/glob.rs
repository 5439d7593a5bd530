//! Redis's glob patterns (`SCAN … MATCH`, `KEYS`, `CONFIG GET`): `*`, `?`, `[abc]`,
//! `[^a-z]`, and `\` to escape, over bytes.

/// Whether `s` matches `p`.
pub fn matches(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    // Where to resume after the last `*`: the pattern just past it, and the string.
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() {
            match p[pi] {
                b'*' => {
                    star = Some((pi + 1, si));
                    pi += 1;
                    continue;
                }
                b'?' => {
                    pi += 1;
                    si += 1;
                    continue;
                }
                b'[' => {
                    if let Some((ok, next)) = class(p, pi, s[si]) {
                        if ok {
                            pi = next;
                            si += 1;
                            continue;
                        }
                    }
                }
                b'\\' if pi + 1 < p.len() => {
                    if p[pi + 1] == s[si] {
                        pi += 2;
                        si += 1;
                        continue;
                    }
                }
                c => {
                    if c == s[si] {
                        pi += 1;
                        si += 1;
                        continue;
                    }
                }
            }
        }
        // A mismatch: let the last `*` take one more byte.
        match star {
            Some((sp, ss)) => {
                pi = sp;
                si = ss + 1;
                star = Some((sp, ss + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// The class `[...]` at `p[at]` against byte `c`: whether it matches and where the
/// pattern continues (an unterminated class runs to the end, as in Redis).
fn class(p: &[u8], at: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = at + 1;
    let not = p.get(i) == Some(&b'^');
    if not {
        i += 1;
    }
    let mut hit = false;
    while i < p.len() && p[i] != b']' {
        if p[i] == b'\\' && i + 1 < p.len() {
            hit |= p[i + 1] == c;
            i += 2;
        } else if i + 2 < p.len() && p[i + 1] == b'-' && p[i + 2] != b']' {
            let (lo, hi) = (p[i].min(p[i + 2]), p[i].max(p[i + 2]));
            hit |= (lo..=hi).contains(&c);
            i += 3;
        } else {
            hit |= p[i] == c;
            i += 1;
        }
    }
    Some((hit != not, (i + 1).min(p.len())))
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn patterns() {
        let t = |p: &str, s: &str| matches(p.as_bytes(), s.as_bytes());
        assert!(t("*", "") && t("*", "abc") && t("a*", "abc") && t("*c", "abc"));
        assert!(t("a*b*c", "aXbYc") && !t("a*b*c", "aXbY"));
        assert!(t("h?llo", "hello") && !t("h?llo", "hllo"));
        assert!(t("h[ae]llo", "hallo") && !t("h[ae]llo", "hillo"));
        assert!(t("h[^e]llo", "hallo") && !t("h[^e]llo", "hello"));
        assert!(t("h[a-c]llo", "hbllo") && !t("h[a-c]llo", "hdllo"));
        assert!(t("key:\\*", "key:*") && !t("key:\\*", "key:x"));
        assert!(t("user:*:name", "user:42:name") && !t("user:*:name", "user:42:age"));
        assert!(!t("abc", "abcd") && !t("abcd", "abc"));
    }
}
