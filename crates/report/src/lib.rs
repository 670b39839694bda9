//! Pictures people look at: image grids with a caption under each tile, line plots of metrics
//! over steps, and animated GIFs of clips. Text is drawn with an 8×8 bitmap font, so no font file
//! is needed.

mod animation;
mod grid;
mod plot;
mod text;

pub use animation::write_gif;
pub use grid::{captioned_grid, Caption};
pub use plot::{line_plot, Series};
pub use text::{draw_text, text_width, wrap};

/// An RGB image.
pub type RgbImage = image::RgbImage;
