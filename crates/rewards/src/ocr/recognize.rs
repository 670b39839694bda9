//! Text recognition: the cropped lines batched by width (48 px high, padded to the widest of the
//! batch), and greedy CTC decoding of the model's per-column character probabilities.

use super::picture::Picture;

/// The recogniser's input height and its narrowest width.
pub const HEIGHT: usize = 48;
const MIN_WIDTH: usize = 320;

/// Line crops per forward pass.
pub const BATCH: usize = 6;

/// The crops grouped into batches of [`BATCH`] after sorting by aspect ratio (as the reference
/// does, so padding is small): each batch is the crop indices and its padded width.
pub fn batches(crops: &[Picture]) -> Vec<(Vec<usize>, usize)> {
    let ratio = |p: &Picture| p.width as f64 / p.height as f64;
    let mut order: Vec<usize> = (0..crops.len()).collect();
    order.sort_by(|&a, &b| ratio(&crops[a]).total_cmp(&ratio(&crops[b])));
    order
        .chunks(BATCH)
        .map(|chunk| {
            let widest = chunk
                .iter()
                .map(|&i| ratio(&crops[i]))
                .fold(MIN_WIDTH as f64 / HEIGHT as f64, f64::max);
            (chunk.to_vec(), (HEIGHT as f64 * widest) as usize)
        })
        .collect()
}

/// One crop as the recogniser sees it: scaled to 48 px high keeping its aspect (at most `width`
/// wide), normalised to [−1, 1], zero-padded on the right to `width`; 3 planes.
pub fn input(crop: &Picture, width: usize) -> Vec<f32> {
    let scaled =
        ((HEIGHT as f64 * crop.width as f64 / crop.height as f64).ceil() as usize).min(width);
    let resized = crop.resize(scaled.max(1), HEIGHT);
    let mut out = vec![0.0; 3 * HEIGHT * width];
    for (i, px) in resized.data.chunks_exact(3).enumerate() {
        let (x, y) = (i % resized.width, i / resized.width);
        for c in 0..3 {
            out[(c * HEIGHT + y) * width + x] = (px[c] as f32 / 255.0 - 0.5) / 0.5;
        }
    }
    out
}

/// Greedy CTC decoding of one line's `steps × classes` probabilities: the most likely class per
/// step, repeats merged, blanks (class 0) dropped. Returns the text and its mean confidence (0 for
/// an empty line).
pub fn decode(probabilities: &[f32], classes: usize, charset: &[String]) -> (String, f64) {
    let mut text = String::new();
    let (mut confidence, mut kept) = (0.0, 0usize);
    let mut previous = None;
    for step in probabilities.chunks_exact(classes) {
        let (best, p) =
            step.iter()
                .enumerate()
                .fold((0, f32::MIN), |(bi, bp), (i, &p)| if p > bp { (i, p) } else { (bi, bp) });
        if best != 0 && previous != Some(best) {
            text.push_str(charset.get(best).map_or("", String::as_str));
            confidence += p as f64;
            kept += 1;
        }
        previous = Some(best);
    }
    (text, if kept == 0 { 0.0 } else { confidence / kept as f64 })
}

/// The recogniser's classes: the blank, the characters of the model's `character` metadata (one
/// per line, Python `splitlines` rules), and a space.
pub fn charset(metadata: &str) -> Vec<String> {
    let breaks =
        ['\n', '\r', '\x0b', '\x0c', '\x1c', '\x1d', '\x1e', '\u{85}', '\u{2028}', '\u{2029}'];
    let mut lines: Vec<String> = vec![];
    let mut current = String::new();
    let mut chars = metadata.chars().peekable();
    while let Some(c) = chars.next() {
        if breaks.contains(&c) {
            if c == '\r' && chars.peek() == Some(&'\n') {
                chars.next();
            }
            lines.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    if !current.is_empty() {
        lines.push(current);
    }
    std::iter::once("blank".to_string()).chain(lines).chain([" ".to_string()]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctc_merges_repeats_and_drops_blanks() {
        let charset = charset("a\nb\r\nc");
        assert_eq!(charset, ["blank", "a", "b", "c", " "]);
        // Steps: a a blank a b b blank → "aab"; confidences of the kept steps averaged.
        let one_hot = |i: usize, p: f32| {
            let mut v = vec![(1.0 - p) / 4.0; 5];
            v[i] = p;
            v
        };
        let steps: Vec<f32> =
            [(1, 0.9), (1, 0.8), (0, 0.9), (1, 0.7), (2, 0.6), (2, 0.9), (0, 0.99)]
                .iter()
                .flat_map(|&(i, p)| one_hot(i, p))
                .collect();
        let (text, conf) = decode(&steps, 5, &charset);
        assert_eq!(text, "aab");
        assert!((conf - (0.9 + 0.7 + 0.6) / 3.0).abs() < 1e-6);
        assert_eq!(decode(&one_hot(0, 0.9), 5, &charset), (String::new(), 0.0));
    }

    #[test]
    fn batches_sort_by_aspect_and_pad_to_the_widest() {
        let crop = |w: usize, h: usize| Picture { width: w, height: h, data: vec![0; w * h * 3] };
        let crops: Vec<Picture> =
            [(100, 10), (20, 10), (300, 10), (30, 10), (40, 10), (50, 10), (60, 10)]
                .iter()
                .map(|&(w, h)| crop(w, h))
                .collect();
        let b = batches(&crops);
        assert_eq!(b[0].0, [1, 3, 4, 5, 6, 0]);
        assert_eq!(b[0].1, 480, "ratio 10 × 48");
        assert_eq!(b[1], (vec![2], 1440));
        let narrow = batches(&[crop(10, 10)]);
        assert_eq!(narrow[0].1, 320, "never narrower than 320");
        let x = input(&crop(96, 48), 320);
        assert_eq!(x.len(), 3 * 48 * 320);
        assert_eq!((x[0], x[95], x[96]), (-1.0, -1.0, 0.0), "black pixels then zero padding");
    }
}
