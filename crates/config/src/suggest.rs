//! "Did you mean": serde's `unknown field` and `unknown variant` messages, which list every
//! allowed name, rewritten to name the nearest one.

/// `message` with an unknown field's list of allowed keys replaced by the nearest key (the list
/// stays when none is near), and the nearest choice added to an unknown variant's list.
pub(crate) fn nearest_name(message: &str) -> String {
    for (kind, keep_list) in [("unknown field", false), ("unknown variant", true)] {
        if let Some(rewritten) = rewrite(message, kind, keep_list) {
            return rewritten;
        }
    }
    message.to_string()
}

fn rewrite(message: &str, kind: &str, keep_list: bool) -> Option<String> {
    let start = message.find(&format!("{kind} `"))?;
    let name_start = start + kind.len() + 2;
    let name_end = name_start + message[name_start..].find('`')?;
    let given = &message[name_start..name_end];
    let rest = &message[name_end + 1..];
    let list_start = rest.find(", expected ")?;
    let list = &rest[list_start + ", expected ".len()..];
    // The list runs to serde_yaml's " at line …" or to the end.
    let list_end = list.find(" at line ").unwrap_or(list.len());
    let (choices_text, tail) = list.split_at(list_end);
    let choices: Vec<&str> = choices_text.split('`').skip(1).step_by(2).collect();
    let near = nearest(given, &choices);
    let head = &message[..name_end + 1];
    Some(match (near, keep_list) {
        (Some(near), false) => format!("{head}{tail}; did you mean `{near}`?"),
        (Some(near), true) => {
            format!("{head}, expected {choices_text}{tail}; did you mean `{near}`?")
        }
        (None, false) => format!("{head}{tail}; the keys here are {choices_text}"),
        (None, true) => return None,
    })
}

/// The choice closest to `given`, if any is close: by Jaro-Winkler similarity, or a choice that
/// contains what was given.
fn nearest<'a>(given: &str, choices: &[&'a str]) -> Option<&'a str> {
    let given_lower = given.to_lowercase();
    let score = |c: &str| {
        let c = c.to_lowercase();
        let contains =
            given_lower.len() >= 3 && (c.contains(&given_lower) || given_lower.contains(&c));
        strsim::jaro_winkler(&given_lower, &c).max(if contains { 0.9 } else { 0.0 })
    };
    choices
        .iter()
        .map(|c| (score(c), *c))
        .filter(|(s, _)| *s >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_nearest_key_or_choice() {
        let yaml = "rollout: unknown field `stepz`, expected one of `steps`, `eval_steps`, \
                    `noise_level` at line 2 column 3";
        assert_eq!(
            nearest_name(yaml),
            "rollout: unknown field `stepz` at line 2 column 3; did you mean `steps`?"
        );
        let path = "unknown field `nosie_level`, expected one of `steps`, `noise_level`";
        assert_eq!(nearest_name(path), "unknown field `nosie_level`; did you mean `noise_level`?");
        let far = "unknown field `zzz`, expected `steps` or `noise_level`";
        assert_eq!(
            nearest_name(far),
            "unknown field `zzz`; the keys here are `steps` or `noise_level`"
        );
        let variant = "unknown variant `dance`, expected one of `sde`, `cps`, `dance_sde`";
        assert_eq!(nearest_name(variant), format!("{variant}; did you mean `dance_sde`?"));
        let none = "unknown variant `qqq`, expected one of `sde`, `cps`";
        assert_eq!(nearest_name(none), none, "no near choice: the list as serde gave it");
        assert_eq!(nearest_name("invalid type: string"), "invalid type: string");
    }
}
