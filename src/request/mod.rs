//! From a speech request to model inputs: caller-text rules and the prompt rows (`model.md` §7).

pub mod prompt;
pub mod text;
pub mod validate;

pub use prompt::{PromptBuilder, PromptError, Reference};
pub use text::{CallerText, Direction, Field, TextError};
