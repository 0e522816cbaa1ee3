//! `config.json` parsing and validation on any text: an error naming the field, never a panic,
//! and any config it accepts yields its dimensions, and reparses from its own JSON to the same
//! dimensions. (Not to the same text: unknown keys are kept as JSON values, and serde_json's
//! default float parsing may move a 17-digit number in one by an ulp.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use limelight::model::config::ModelConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match ModelConfig::from_json(text) {
        Ok(config) => {
            let again = ModelConfig::from_json(&config.to_json_pretty()).expect("an accepted config reparses");
            assert_eq!(format!("{:?}", again.dims()), format!("{:?}", config.dims()));
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
