//! systemd integration (`Type=notify`, sd_notify(3)): `STATUS=` while loading, `READY=1` when
//! `/ready` turns 200, `STOPPING=1` when the drain begins. Every call is a no-op without
//! `$NOTIFY_SOCKET`, so the same binary runs outside systemd unchanged.

use sd_notify::NotifyState;

/// Free text for `systemctl status`.
pub fn status(text: &str) {
    send(&[NotifyState::Status(&one_line(text))]);
}

/// The model is loaded and the socket is bound: the unit becomes active.
pub fn ready(text: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(&one_line(text))]);
}

/// The drain has begun: the unit is deactivating.
pub fn stopping(text: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(&one_line(text))]);
}

/// Status text on one line: a newline would end the `STATUS=` field and start another.
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

fn send(states: &[NotifyState<'_>]) {
    // A lost notification must not stop the server; systemd's timeouts will tell the operator.
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "sd_notify failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_text_stays_on_one_line() {
        assert_eq!(one_line("loading /models/a\nREADY=1"), "loading /models/a READY=1");
    }
}
