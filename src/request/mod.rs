//! From a speech request to model inputs: caller-text rules, the prompt rows (`model.md` §7),
//! and long text split into chunks sized for the model (`split`), each chunk's prompt carrying
//! the earlier chunks as history (`chunked`).

pub mod chunked;
pub mod normalize;
pub mod number_words;
pub mod prompt;
pub mod split;
pub mod text;
pub mod validate;

pub use prompt::{PromptBuilder, PromptError, Reference};
pub use text::{CallerText, Direction, Field, TextError};
