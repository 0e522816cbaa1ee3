//! Wire types of the OpenAI-compatible API (`shared/spec/api.md`): serde shapes only, no logic and
//! no engine types. Only `api` and `http` know these formats.

pub mod error;
pub mod models;
pub mod speech;
pub mod voices;

pub use error::{ErrorBody, ErrorDetail};
pub use models::{ModelCard, ModelList};
pub use speech::{ResponseFormat, SpeechEvent, SpeechRequest, StreamFormat, Usage, Voice};
pub use voices::{VoiceDeleted, VoiceInfo, VoiceList, VoiceUpload};
