//! WanPipeline's prompt cleaning against ftfy 6.3.1 + `html.unescape` twice + whitespace runs
//! (`scripts/reference_prompt_clean.py`): curly quotes, entities, ligatures, full-width forms,
//! mojibake, terminal escapes, line breaks, control characters, NFC.

use flowtune_models::prompt_clean::clean_prompt;

#[test]
fn prompts_are_cleaned_as_ftfy_and_html_unescape_do() {
    let cases = flowtune_fixtures::json("prompt_clean.json");
    let cases = cases.as_array().expect("a list of cases");
    assert!(cases.len() >= 20);
    let wrong: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            let (prompt, want) = (c["prompt"].as_str()?, c["cleaned"].as_str()?);
            let got = clean_prompt(prompt);
            (got != want).then(|| format!("{prompt:?}: got {got:?}, want {want:?}"))
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
