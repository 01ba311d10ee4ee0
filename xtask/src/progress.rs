//! Progress bars (indicatif) for the library's [`tessel::Progress`] calls.

use indicatif::{ProgressBar, ProgressStyle};

/// Draws a bar per phase on stderr; notes go above it (stderr), or to stdout for commands
/// whose notes are the output (`bench cpu` rows).
pub struct Bar {
    bar: Option<ProgressBar>,
    draw: bool,
    notes_to_stdout: bool,
}

impl Bar {
    /// A bar where `draw`; notes on stderr either way.
    pub fn new(draw: bool) -> Self {
        Bar {
            bar: None,
            draw,
            notes_to_stdout: false,
        }
    }

    /// Notes are table rows on stdout, shown only where `show`.
    pub fn lines(show: bool) -> Self {
        Bar {
            bar: None,
            draw: show,
            notes_to_stdout: true,
        }
    }
}

impl tessel::Progress for Bar {
    fn start(&mut self, unit: &str, total: u64) {
        if !self.draw || self.notes_to_stdout {
            return;
        }
        let bar = ProgressBar::new(total);
        let template =
            format!("{{spinner}} [{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} {unit}  {{msg}}");
        bar.set_style(
            ProgressStyle::with_template(&template)
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        self.bar = Some(bar);
    }

    fn update(&mut self, done: u64, message: &str) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            if !message.is_empty() {
                bar.set_message(message.to_string());
            }
        }
    }

    fn note(&mut self, line: &str) {
        if self.notes_to_stdout {
            if self.draw {
                println!("{line}");
            }
            return;
        }
        match &self.bar {
            Some(bar) if !bar.is_hidden() => bar.println(line),
            _ => eprintln!("{line}"),
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
