//! Pretrains the cost model on one shipped dataset (avx2 FMA records of ResNet-50), fine-tunes
//! it on a few records of another (the vectorized-loop fallback), and prints top-k beside ridge
//! and random.
//!
//! ```sh
//! cargo run --release -p tessel --example pretrain_transfer -- 10 128
//! ```
//! (epochs, fine-tuning records).

use tessel::model::train::Comparison;
use tessel::{Notes, PretrainOptions, TransferOptions, fixtures_dir};

fn show(label: &str, c: &Comparison) {
    println!("{label}");
    for (name, m) in [
        ("model", &c.model),
        ("ridge", &c.ridge),
        ("random", &c.random),
    ] {
        println!(
            "  {name:<7} top-1 {:.3}  top-5 {:.3}  pairwise {:.3}",
            m.top1, m.top5, m.pairwise_accuracy
        );
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The model's thread pool as large as the CPUs this process may use (`taskset`).
    // SAFETY: no other thread has started yet.
    unsafe { tessel::fit_threads_to_affinity() };
    let mut args = std::env::args().skip(1);
    let epochs: usize = args.next().map_or(Ok(10), |t| t.parse())?;
    let shots: usize = args.next().map_or(Ok(128), |t| t.parse())?;
    let data = fixtures_dir().join("datasets");
    let dir = std::env::temp_dir().join(format!("tessel-example-{}", std::process::id()));

    let pretrain = PretrainOptions {
        networks: vec!["resnet50".into()],
        epochs,
        loss: "pairwise".parse()?,
        lr: 1e-3,
        ..PretrainOptions::new(vec![data.join("cpu-avx2-fma.jsonl.gz")], dir.join("avx2"))
    };
    let mut notes = Notes::default();
    let trained = tessel::pretrain(&pretrain, &mut notes)?;
    println!(
        "pretrained on {} records of {} tasks (best epoch {})",
        trained.records, trained.tasks, trained.training.best_epoch
    );
    if let Some(c) = &trained.validation {
        show("validation tasks (avx2 FMA):", c);
    }

    let transfer = TransferOptions {
        model: trained.saved.0.clone(),
        data: vec![data.join("cpu-scalar.jsonl.gz")],
        networks: Vec::new(),
        shots,
        shots_per_task: tessel::DEFAULT_SHOTS_PER_TASK,
        out: dir.join("scalar"),
        mode: "all".into(),
        epochs,
        seed: 1,
        correction_trees: tessel::model::ensemble::CORRECTION_RECIPE,
        force: false,
    };
    let moved = tessel::transfer(&transfer, &mut notes)?;
    println!(
        "fine-tuned on {} records of the fallback; tested on {} records of {} other tasks",
        moved.shots, moved.test_records, moved.test_tasks
    );
    show("before fine-tuning:", &moved.before);
    show("after fine-tuning:", &moved.after);
    show("from scratch on the same records:", &moved.scratch);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
