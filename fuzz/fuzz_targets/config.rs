//! `config.json` parsing and validation on any text: an error naming the field, never a panic,
//! and any config it accepts yields its dimensions.
#![no_main]

use libfuzzer_sys::fuzz_target;
use limelight::model::config::ModelConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match ModelConfig::from_json(text) {
        Ok(config) => {
            let _ = config.dims();
            let again = ModelConfig::from_json(&config.to_json_pretty()).expect("an accepted config reparses");
            assert_eq!(again.to_json_pretty(), config.to_json_pretty());
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
