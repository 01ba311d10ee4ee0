//! Reports as tables for people (`--json` prints them whole instead).

use anyhow::Result;
use tessel::model::train::Comparison;
use tessel::{
    BenchReport, CoverageOptions, CoverageReport, DatasetOptions, DatasetReport, Emit, EvalReport,
    MeasureReport, PretrainReport, RemeasureOptions, RemeasureReport, SearchEvalReport,
    SimCheckReport, TransferReport, TuneOptions, TuneReport, TuningRecord,
};

fn opt(x: Option<f64>, precision: usize) -> String {
    x.map_or("-".to_string(), |v| format!("{v:.precision$}"))
}

pub fn measure(r: &MeasureReport) {
    println!("{}", r.workload);
    println!(
        "  median {:.4} ms, min {:.4} ms over {} runs (spread {:.1}%): {:.1} GFLOP/s{}",
        r.latency_ms,
        r.min_ms,
        r.runs,
        100.0 * r.spread,
        r.gflops,
        if r.emulated {
            "  [EMULATED: a correctness check, not a timing of the real instruction]"
        } else {
            ""
        }
    );
    println!(
        "  compile {:.2} s; {} on {} thread(s), {}",
        r.compile_time_s, r.fingerprint.model, r.threads, r.fingerprint.compiler
    );
}

pub fn bench(r: &BenchReport) {
    println!(
        "timer: {:.0} ns per timed run ({:.2}% of a 10 us kernel)",
        r.timer_overhead_ns,
        r.timer_overhead_ns / 100.0
    );
    println!(
        "compile: {:.0} ms per candidate in a batch of {} (one candidate alone: {:.0} ms)",
        r.compile_ms_per_candidate_batched, r.batch_size, r.compile_ms_single_candidate
    );
    println!(
        "measurement overhead: {:.2} ms per candidate (worker round trip, input setup, reference check)",
        r.measure_overhead_ms_per_candidate
    );
}

pub fn tune(r: &TuneReport, opts: &TuneOptions) {
    let how = if r.estimates {
        "[estimates, not measurements]".to_string()
    } else if r.target == "gpu" {
        format!("(measured, {})", r.compiler)
    } else {
        format!("({} thread(s))", opts.threads)
    };
    println!(
        "{} on {} {how}, cost model: {}",
        r.workload, r.machine, r.model
    );
    if !r.estimates && r.target == "cpu" {
        println!(
            "instructions searched: {}",
            if r.instructions.is_empty() {
                "none (vectorized loops only)".to_string()
            } else {
                r.instructions.join(", ")
            }
        );
    }
    println!(
        "{:>6} {:>7} {:>10} {:>9} {:>7}  workload / best mapping",
        "weight", "trials", "best ms", "GFLOP/s", "% peak"
    );
    for t in &r.tasks {
        println!(
            "{:>6} {:>7} {:>10} {:>9} {:>7}  {}\n{:>44}{}",
            t.weight,
            t.trials,
            opt(t.latency_ms, 4),
            opt(t.gflops, 1),
            opt(t.percent_of_peak, 1),
            t.workload,
            "",
            t.mapping
                .clone()
                .unwrap_or_else(|| "no instruction (vectorized loops)".into())
        );
    }
    match (r.latency_ms, r.gflops) {
        (Some(l), Some(g)) => println!("best: {l:.4} ms, {g:.1} GFLOP/s"),
        _ => println!("best: no task has a valid candidate yet"),
    }
    for t in &r.tasks {
        if let Some(ms) = t.remeasured_ms {
            let spread = t.allocation_spread.map_or(String::new(), |s| {
                format!(", spread {:.1}% across them", 100.0 * s)
            });
            let which = match t.winner_search_rank {
                Some(1) | None => "the search's best".to_string(),
                Some(r) => format!(
                    "the search's #{r} ({})",
                    t.remeasured_mapping
                        .as_deref()
                        .unwrap_or("vectorized loops")
                ),
            };
            println!(
                "re-measured {} finalist(s) in {} fresh processes, {} allocations each; the fastest, {which}: {ms:.4} ms{spread}  ({})",
                t.finalists,
                tessel::REMEASURE_PROCESSES,
                tessel::REMEASURE_ALLOCATIONS,
                t.workload
            );
        }
    }
    println!(
        "{} trials ({} measured now, {} from the log, {} errors, {} cut short) in {:.1} s; search overhead {:.2} s ({:.1}%)",
        r.trials,
        r.measured_this_run,
        r.resumed_from_log,
        r.errors,
        r.cut_short,
        r.search_time_s,
        r.search_overhead_s,
        r.search_overhead_percent
    );
    if let Some(path) = &opts.log {
        println!("records: {}", path.display());
    }
}

pub fn best(best: &[TuningRecord], emit: Option<Emit>, json: bool) -> Result<()> {
    if json && emit.is_none() {
        println!("{}", serde_json::to_string(best)?);
        return Ok(());
    }
    for r in best {
        let (workload, target) = (&r.workload, &r.target);
        match emit {
            None => {
                let m = r.result.as_ref().ok();
                println!(
                    "{workload} [{target}]: {:.4} ms, {:.1} GFLOP/s, {}",
                    m.map_or(0.0, |m| m.timing.median_s * 1e3),
                    m.map_or(0.0, |m| m.gflops),
                    r.mapping.clone().unwrap_or_else(|| "no instruction".into())
                )
            }
            // Plain JSON, so that `measure --trace` and `features --trace` read it back.
            Some(Emit::Trace) => println!("{}", tessel::emit(r, Emit::Trace)?),
            Some(Emit::C) => println!("/* {workload} [{target}] */\n{}", tessel::emit(r, Emit::C)?),
            Some(Emit::Cuda) => {
                println!("// {workload} [{target}]\n{}", tessel::emit(r, Emit::Cuda)?)
            }
        }
    }
    Ok(())
}

pub fn search_eval(r: &SearchEvalReport) {
    println!(
        "{} against random, {} trials ({} at random), {} seeds each (population {}, {} generations): trials to {:.0}% of the best any run found",
        r.model,
        r.trials,
        r.random_trials,
        r.seeds,
        r.population,
        r.generations,
        100.0 * r.threshold
    );
    println!(
        "{:>9} {:>13} {:>13} {:>9} {:>17} {:>17}  workload",
        "best", "model trials", "random trials", "ratio", "final model/rand", "to random's best"
    );
    for t in &r.tasks {
        // A run that missed counts as all its trials: mark the mean as a lower bound.
        let mark = |missed: usize| if missed > 0 { ">=" } else { "" };
        println!(
            "{:>9.1} {:>13} {:>13} {:>9} {:>8.1}/{:<8.1} {:>8.1}/{:<8.1}  {}",
            t.best_gflops,
            format!("{}{:.1}", mark(t.missed.0), t.model_trials),
            format!("{}{:.1}", mark(t.missed.1), t.random_trials),
            if t.model_trials > 0.0 {
                format!(
                    "{}{:.2}x",
                    ratio_mark(t.missed.0, t.missed.1),
                    t.random_trials / t.model_trials
                )
            } else {
                "-".into()
            },
            t.final_gflops.0,
            t.final_gflops.1,
            t.to_random_best.0,
            t.to_random_best.1,
            t.workload
        );
    }
    let missed = r
        .tasks
        .iter()
        .fold((0, 0), |(m, n), t| (m + t.missed.0, n + t.missed.1));
    match r.trials_ratio {
        Some(x) => println!(
            "to {:.0}% of the best: random needs {}{x:.2}x the model's trials (summed over tasks; a run that missed counts as all its trials)",
            100.0 * r.threshold,
            ratio_mark(missed.0, missed.1),
        ),
        None => println!("no task has a valid candidate"),
    }
    if missed.0 > 0 && missed.1 > 0 {
        println!(
            "~: runs of both rankings missed, so that ratio is no bound either way (>=: only random missed; <=: only the model)"
        );
    }
    if let Some(x) = r.random_best_ratio {
        let missed: usize = r.tasks.iter().map(|t| t.to_random_best_missed).sum();
        println!(
            "to random's own final best: random needs {x:.2}x the model's trials (summed over tasks; the model missed it in {missed} pairs)"
        );
    }
    for ranking in [tessel::Ranking::Model, tessel::Ranking::Random] {
        let runs: Vec<&tessel::SearchRun> = r
            .tasks
            .iter()
            .flat_map(|t| &t.runs)
            .filter(|run| run.ranking == ranking && run.wall_s.is_some())
            .collect();
        if let Some(worst) = runs
            .iter()
            .filter_map(|run| run.search_overhead_percent)
            .reduce(f64::max)
        {
            let wall: f64 = runs.iter().filter_map(|run| run.wall_s).sum();
            println!(
                "{ranking:?} runs measured now: {} in {wall:.0} s, search overhead at most {worst:.1}% of a run",
                runs.len()
            );
        }
    }
    for (at, ratio) in &r.best_ratio_at {
        println!("after {at} trials the model's best is {ratio:.3}x random's (geometric mean)");
    }
}

/// What random's trials over the model's are, given the runs that missed the threshold (each
/// counted as all its trials): exact, a lower bound (only random missed), an upper bound
/// (only the model missed), or no bound at all (both did).
fn ratio_mark(model_missed: usize, random_missed: usize) -> &'static str {
    match (model_missed > 0, random_missed > 0) {
        (false, false) => "",
        (false, true) => ">=",
        (true, false) => "<=",
        (true, true) => "~",
    }
}

/// Tasks of a coverage report printed, and missing mappings of each.
const COVERAGE_TASKS: usize = 30;
const COVERAGE_MAPPINGS: usize = 2;

pub fn coverage(r: &CoverageReport, opts: &CoverageOptions) {
    println!(
        "{}: {} records of {} tasks, checked against today's schedule space",
        opts.data.display(),
        r.records,
        r.tasks
    );
    for (target, n) in &r.unchecked {
        println!("  {n} records of target `{target}` not checked (no CPU platform in the target)");
    }
    if r.outside > 0 {
        println!(
            "{} records use a mapping today's space no longer offers (cut, or described otherwise since)",
            r.outside
        );
    }
    if r.gaps.is_empty() {
        println!("every task has records of every mapping its space offers");
        return;
    }
    println!(
        "{} tasks have no record of some mapping today's space offers:",
        r.gaps.len()
    );
    println!("  records  mappings  missing  task (platform)");
    for g in r.gaps.iter().take(COVERAGE_TASKS) {
        println!(
            "  {:>7}  {:>8}  {:>7}  {} ({})",
            g.records,
            g.mappings,
            g.missing.len(),
            g.workload,
            g.platform
        );
        for m in g.missing.iter().take(COVERAGE_MAPPINGS) {
            println!("{:>30}{m}", "");
        }
        if g.missing.len() > COVERAGE_MAPPINGS {
            println!(
                "{:>30}... and {} more",
                "",
                g.missing.len() - COVERAGE_MAPPINGS
            );
        }
    }
    if r.gaps.len() > COVERAGE_TASKS {
        println!("  ... and {} more tasks", r.gaps.len() - COVERAGE_TASKS);
    }
    println!(
        "(--json lists every task and mapping.) To fill a task: cargo xtask dataset --workload W --platform P --per-task 200 --seed S --out new.jsonl, then append new.jsonl to the dataset"
    );
}

pub fn remeasure(r: &RemeasureReport, opts: &RemeasureOptions) {
    println!(
        "{} records selected of {} ({} of another machine left alone), in {} tasks",
        r.selected,
        r.records,
        r.other_machine,
        r.by_task.len()
    );
    for (task, n) in r.by_task.iter().take(10) {
        println!("  {n:>6}  {task}");
    }
    if r.by_task.len() > 10 {
        println!("  ... and {} more tasks", r.by_task.len() - 10);
    }
    if opts.dry_run {
        println!("dry run: nothing measured");
        return;
    }
    println!(
        "{} measured again ({} errors), appended to {}, {:.1} s",
        r.measured,
        r.errors,
        r.out.display(),
        r.seconds
    );
    if let Some(g) = r.geomean_ratio {
        println!("new / old latency: geometric mean {g:.3}; largest changes:");
    }
    for c in &r.largest_changes {
        println!(
            "  {:>10.4} ms -> {:>10.4} ms  {}",
            c.old_ms, c.new_ms, c.workload
        );
    }
}

pub fn dataset(r: &DatasetReport, opts: &DatasetOptions) {
    println!(
        "{} tasks on {} ({}): {} schedules measured ({} from search rounds ranked by {}, the rest random; {} errors, {} cut short), {} already in {}, {:.1} s",
        r.tasks,
        r.platform,
        r.machine,
        r.measured,
        r.searched,
        r.search_model,
        r.errors,
        r.cut_short,
        r.existing,
        opts.out.display(),
        r.seconds
    );
    if let Some(c) = &r.canary {
        println!(
            "canary {}: {} runs, {:.3}-{:.3} ms (median {:.3}; drift {:.0}%), log {}",
            c.workload,
            c.runs,
            c.min_ms,
            c.max_ms,
            c.median_ms,
            100.0 * c.drift(),
            c.log.display()
        );
    }
}

fn comparison(label: &str, c: &Comparison) {
    comparison_with(label, c, None);
}

/// A comparison with the shipped ensemble's row (the network plus its trees) first.
fn comparison_with(label: &str, c: &Comparison, ensemble: Option<&tessel::model::Metrics>) {
    println!("{label}");
    println!(
        "  {:<8} {:>6} {:>6} {:>9} {:>8}",
        "", "top-1", "top-5", "pairwise", "tau"
    );
    if let Some(m) = ensemble {
        println!(
            "  {:<8} {:>6.3} {:>6.3} {:>9.3} {:>8.3}  (the network + its trees: what tune ranks by)",
            "ensemble", m.top1, m.top5, m.pairwise_accuracy, m.kendall_tau
        );
    }
    for (name, m) in [
        ("model", &c.model),
        ("ridge", &c.ridge),
        ("trees", &c.gbt),
        ("roofline", &c.roofline),
        ("random", &c.random),
    ] {
        println!(
            "  {name:<8} {:>6.3} {:>6.3} {:>9.3} {:>8.3}",
            m.top1, m.top5, m.pairwise_accuracy, m.kendall_tau
        );
    }
}

pub fn pretrain(r: &PretrainReport) {
    println!(
        "{} records of {} tasks; model of {} parameters",
        r.records, r.tasks, r.parameters
    );
    if let Some(c) = &r.validation {
        comparison_with(
            &format!(
                "validation ({} held-out tasks; kept epoch {}{}):",
                r.validation_tasks,
                r.training.best_epoch,
                if r.training.leading_epoch == r.training.best_epoch {
                    String::new()
                } else {
                    format!("; epoch {} led within the noise", r.training.leading_epoch)
                }
            ),
            c,
            r.validation_ensemble.as_ref(),
        );
    }
    if let Some(m) = &r.ensemble_mix {
        mix("ensemble", m);
    }
    println!("saved {} and {}", r.saved.0.display(), r.saved.1.display());
    if let Some(p) = &r.saved_ensemble {
        println!("saved {} (the trees of the ensemble)", p.display());
    }
}

/// The trees' share an ensemble kept, and the criterion of every share tried.
fn mix(what: &str, m: &tessel::model::ensemble::MixChoice) {
    let tried: Vec<String> = m
        .tried
        .iter()
        .map(|(share, c)| format!("{share:.1}:{c:.3}"))
        .collect();
    println!(
        "{what}: the trees' share {:.1}, chosen on {} validation tasks ({} records) among share:criterion {}",
        m.tree_share,
        m.tasks,
        m.records,
        tried.join(" ")
    );
}

pub fn refit_trees(r: &tessel::RefitReport) {
    println!(
        "{} records of {} tasks; trees fitted on {} records, judged on {} validation tasks ({})",
        r.records, r.tasks, r.fit_records, r.validation_tasks, r.validation_from
    );
    println!(
        "  {:<16} {:>6} {:>6} {:>9} {:>10}",
        "", "top-1", "top-5", "pairwise", "criterion"
    );
    let row = |name: &str, m: &tessel::model::Metrics, c: Option<f64>| {
        let c = c.map_or("-".to_string(), |c| format!("{c:.3}"));
        println!(
            "  {:<16} {:>6.3} {:>6.3} {:>9.3} {:>10}",
            name, m.top1, m.top5, m.pairwise_accuracy, c
        );
    };
    row("network alone", &r.network, None);
    if let Some(m) = &r.before {
        row("with old trees", m, r.before_criterion);
    }
    row("with new trees", &r.after, Some(r.after_criterion));
    mix("new trees", &r.mix);
    if let Some(g) = &r.gain {
        println!(
            "new over old trees, task by task: {:+.3} ({:.1} standard errors over {} tasks; {:.0} needed to replace)",
            g.mean,
            g.z(),
            g.tasks,
            tessel::REPLACE_MIN_GAIN_Z
        );
    }
    if r.replaced {
        println!("saved {} (the new trees)", r.ensemble.display());
    } else {
        println!(
            "kept {}: the new trees do not rank the validation tasks better beyond the noise (--force replaces them)",
            r.ensemble.display()
        );
    }
}

pub fn transfer(r: &TransferReport) {
    let drawn = match r.shots_per_task {
        0 => "at random".to_string(),
        m => format!("{m} a task"),
    };
    println!(
        "{} shots ({drawn}, {} mode); evaluated on {} records of {} tasks",
        r.shots, r.mode, r.test_records, r.test_tasks
    );
    comparison_with(
        "pretrained, before fine-tuning (the ensemble: with its own trees, fitted where it was pretrained):",
        &r.before,
        r.before_ensemble.as_ref(),
    );
    comparison_with(
        "fine-tuned on the shots (the ensemble: with trees fitted on the shots):",
        &r.fine_tuned,
        r.fine_tuned_ensemble.as_ref(),
    );
    if let Some(m) = &r.fine_tuned_pretrained_trees {
        println!(
            "  fine-tuned with the pretrained model's trees: top-1 {:.3} top-5 {:.3} pairwise {:.3} tau {:.3}",
            m.top1, m.top5, m.pairwise_accuracy, m.kendall_tau
        );
    }
    if let Some(m) = &r.pretrained_corrected {
        println!(
            "  pretrained with its trees and a correction learned on the shots: top-1 {:.3} top-5 {:.3} pairwise {:.3} tau {:.3}",
            m.top1, m.top5, m.pairwise_accuracy, m.kendall_tau
        );
        println!("    (the correction: {})", r.correction_trees);
    }
    comparison("trained from scratch on the same records:", &r.scratch);
    match &r.validation {
        Some(v) => {
            println!(
                "validation on the shots, two folds ({} records of {} tasks, {} pairs, each ranked by candidates trained on the other half, {} records):",
                v.validation_records, v.validation_tasks, v.validation_pairs, v.fit_records
            );
            println!(
                "                               criterion  top-1  pairwise  by network: top-1  top-5  gain over as it came"
            );
            for (name, s) in v.candidates() {
                match s {
                    Some(s) => {
                        let gain = s.gain.map_or(String::from("(as it came)"), |g| {
                            format!("{:+.3} ({:+.1} s.e.)", g.mean, g.z())
                        });
                        let gain = match s.network_gain {
                            Some(g) => {
                                format!("{gain}; by network {:+.3} ({:+.1} s.e.)", g.mean, g.z())
                            }
                            None => gain,
                        };
                        let by_network = s
                            .by_network
                            .map_or(format!("{:>19}  {:>5}", "-", "-"), |m| {
                                format!("{:>19.3}  {:.3}", m.top1, m.top5)
                            });
                        println!(
                            "  {name:<28} {:>9.3}  {:.3}  {:>8.3}  {by_network}  {gain}",
                            s.criterion, s.metrics.top1, s.metrics.pairwise_accuracy
                        )
                    }
                    None => println!("  {name:<28}         -"),
                }
            }
            println!(
                "  (criterion: the mean of the per-task top-1 and top-5 ratios and the pairwise accuracy;"
            );
            println!(
                "   gain: task by task, in standard errors; a candidate must lead by {} to be kept",
                tessel::TRANSFER_MIN_GAIN_Z
            );
            if v.networks.is_empty() {
                println!(
                    "   nothing by network: no validation task falls in a network the data holds whole)"
                );
            } else {
                println!(
                    "   and must not lag on top-1 by network by {} standard error or more, network by network; networks: {})",
                    tessel::TRANSFER_MAX_NETWORK_LOSS_Z,
                    v.networks.join(", ")
                );
            }
            println!(
                "  (of the candidates that pass, the surest lead is kept: the most standard errors, then the criterion;"
            );
            println!(
                "   where none passes, the correction if its gain is above 0 task by task and not under 0 by network)"
            );
            if v.validation_pairs < tessel::MIN_VALIDATION_PAIRS {
                println!(
                    "  (under {} pairs: too little to leave the pretrained model on)",
                    tessel::MIN_VALIDATION_PAIRS
                );
            } else if v.validation_tasks < tessel::MIN_VALIDATION_TASKS {
                println!(
                    "  (under {} tasks: too few to leave the pretrained model on)",
                    tessel::MIN_VALIDATION_TASKS
                );
            }
        }
        None => {
            println!("no validation possible on the shots (fewer than two tasks of two records)")
        }
    }
    println!("kept: {} (what the saved model is)", r.chosen);
    if let Some(kept) = r.by_network.first() {
        println!(
            "by network, as held-out scores them (each network's test tasks, then the mean over the {} networks):",
            kept.networks.len()
        );
        println!("                                       top-1  top-5  pairwise      tau");
        for b in &r.by_network {
            let label = match b.ranking.as_str() {
                "kept" => format!("kept ({})", r.chosen),
                "pretrained+trees" => "pretrained+trees (K=0)".to_string(),
                other => other.to_string(),
            };
            println!(
                "  {label:<36} {:.3}  {:.3}     {:.3}   {:>6.3}",
                b.mean.top1, b.mean.top5, b.mean.pairwise_accuracy, b.mean.kendall_tau
            );
        }
        let names: Vec<String> = kept
            .networks
            .iter()
            .map(|(n, m)| format!("{n} {:.2}", m.top1))
            .collect();
        println!("  kept, top-1 by network: {}", names.join(", "));
    }
    losses(
        "where the kept model's top-1 loses most on the test tasks",
        &r.task_picks,
    );
    losses(
        "where the model as it came (K=0) loses most on them",
        &r.before_task_picks,
    );
    println!("saved {} and {}", r.saved.0.display(), r.saved.1.display());
    if let Some(p) = &r.saved_ensemble {
        println!("saved {} (the kept model's trees)", p.display());
    }
}

/// The five tasks that lose a top-1 score most, with their shares of the loss.
fn losses(title: &str, picks: &[tessel::TaskPick]) {
    let losing: Vec<_> = picks.iter().filter(|p| p.loss_share > 0.0).collect();
    if losing.is_empty() {
        return;
    }
    println!("{title} (latency-weighted; share of the loss):");
    for p in losing.iter().take(5) {
        println!(
            "  {:5.1}%  {}  (x{}, {} records): picked {:.3} ms, best {:.3} ms ({:.2}x)",
            100.0 * p.loss_share,
            // The key's workload; its target and machine are the data's.
            p.task.split(" @ ").next().unwrap_or(&p.task),
            p.weight,
            p.records,
            1e3 * p.chosen_s,
            1e3 * p.best_s,
            p.chosen_s / p.best_s
        );
    }
}

pub fn eval(r: &EvalReport) {
    if let Some((dir, no_png)) = &r.plots {
        match no_png {
            None => println!("plots (SVG and PNG) in {}", dir.display()),
            Some(why) => println!("plots (SVG) in {}; no PNG: {why}", dir.display()),
        }
    }
    let model = tessel::model::Metrics {
        top1: r.top1,
        top5: r.top5,
        pairwise_accuracy: r.pairwise_accuracy,
        kendall_tau: r.kendall_tau,
    };
    comparison_with(
        &format!(
            "{} on {} records of {} tasks (ridge and trees: fitted on half the tasks, tested on the other):",
            r.model, r.records, r.tasks
        ),
        &Comparison {
            model,
            ridge: r.ridge,
            gbt: r.gbt,
            roofline: r.roofline,
            random: r.random,
        },
        r.ensemble.as_ref(),
    );
    let whose = if r.ensemble.is_some() {
        "ensemble"
    } else {
        "model"
    };
    losses(
        &format!("where the {whose}'s top-1 loses most"),
        &r.task_picks,
    );
    if let Some(a) = &r.against {
        println!(
            "against {}: top-1 {:.3} top-5 {:.3} pairwise {:.3}; criterion {:.3} against this model's {:.3}",
            a.model,
            a.ranking.top1,
            a.ranking.top5,
            a.ranking.pairwise_accuracy,
            a.criterion,
            a.model_criterion
        );
        println!(
            "this model's gain over it, task by task: {:+.3} ({:.1} standard errors over {} tasks)",
            a.gain.mean,
            a.gain.z(),
            a.gain.tasks
        );
    }
}

pub fn held_out(r: &tessel::HeldOutReport) {
    println!(
        "trained on {} records of {} tasks (kept epoch {}{}); tested on {} records of {} held-out tasks",
        r.train_records,
        r.train_tasks,
        r.best_epoch,
        r.ablation_best_epoch
            .map_or(String::new(), |e| format!(", ablation {e}")),
        r.test_records,
        r.test_tasks
    );
    mix("ensemble", &r.ensemble_mix);
    if r.trees_refit {
        println!(
            "ensemble: its trees then fitted again on every training task (--refit-trees), the early-stopping tasks included"
        );
    }
    // One line: the network, its tasks, then a 17-wide cell per ranker.
    let line = |network: &str, tasks: &str, cells: &[String]| {
        let cells: Vec<String> = cells.iter().map(|c| format!("{c:>17}")).collect();
        println!("{network:<16} {tasks:>5}  {}", cells.join(" "));
    };
    let rankers = [
        "model",
        "primitives",
        "ridge",
        "trees",
        "roofline",
        "ensemble",
        "random",
    ];
    line("network", "tasks", &rankers.map(String::from));
    line("", "", &rankers.map(|_| "top1 top5 pair".to_string()));
    let cell = |m: Option<&tessel::model::Metrics>| match m {
        Some(m) => format!("{:.2} {:.2} {:.2}", m.top1, m.top5, m.pairwise_accuracy),
        None => "-".to_string(),
    };
    let row = |name: &str, tasks: String, s: &tessel::Scores| {
        line(
            name,
            &tasks,
            &[
                cell(Some(&s.model)),
                cell(s.primitives.as_ref()),
                cell(Some(&s.ridge)),
                cell(Some(&s.gbt)),
                cell(Some(&s.roofline)),
                cell(Some(&s.ensemble)),
                cell(Some(&s.random)),
            ],
        )
    };
    for n in &r.networks {
        row(
            &n.network,
            format!("{}/{}", n.tasks, n.tasks_in_network),
            &n.scores,
        );
    }
    row("average", String::new(), &r.average);
    // Bars such as top-5 >= 0.97 sit at the table's last place: 0.965 prints as 0.97 there,
    // and 0.9698 as 0.970 at three places. Cut, not rounded: a figure under a bar of up to
    // four places never prints at or over it.
    let cut = |x: f64| (x * 1e4).floor() / 1e4;
    let exact = |m: &tessel::model::Metrics| {
        format!(
            "{:.4} / {:.4} / {:.4}",
            cut(m.top1),
            cut(m.top5),
            cut(m.pairwise_accuracy)
        )
    };
    println!(
        "average to four places (cut, not rounded), top-1 / top-5 / pairwise: ensemble {}, model {}, trees {}",
        exact(&r.average.ensemble),
        exact(&r.average.model),
        exact(&r.average.gbt)
    );
    // Top-1 is weighted by latency: one heavy task picked badly can decide a network.
    let losing = r
        .networks
        .iter()
        .flat_map(|n| {
            n.picks
                .iter()
                .filter(|p| p.loss_share > 0.0)
                .take(3)
                .map(move |p| (n, p))
        })
        .collect::<Vec<_>>();
    if !losing.is_empty() {
        println!(
            "where the ensemble's top-1 loses most (share of its loss on the network; chosen / best latency of each ranker):"
        );
    }
    for (n, p) in losing {
        println!(
            "  {:<16} {:5.1}%  ensemble {:.2}x  model {:.2}x  trees {:.2}x  best {:.3} ms (x{})  {}",
            n.network,
            100.0 * p.loss_share,
            p.ensemble_s / p.best_s,
            p.model_s / p.best_s,
            p.trees_s / p.best_s,
            1e3 * p.best_s,
            p.weight,
            p.workload
        );
    }
}

pub fn sim_check(r: &SimCheckReport) {
    println!(
        "{} (analytical model) ranking {} measured records of {} workloads ({} unscored)",
        r.device, r.records, r.workloads, r.unscored
    );
    println!(
        "{:>8} {:>7} {:>7} {:>9} {:>8}",
        "", "top-1", "top-5", "pairwise", "tau"
    );
    for (name, m) in [("model", &r.model), ("random", &r.random)] {
        println!(
            "{name:>8} {:>7.3} {:>7.3} {:>9.3} {:>8.3}",
            m.top1, m.top5, m.pairwise_accuracy, m.kendall_tau
        );
    }
    println!(
        "median estimate / measured latency: {:.2}",
        r.median_estimate_over_measured
    );
}

pub fn export(r: &tessel::ExportReport) {
    println!(
        "exported {} kernel(s) to {} ({})",
        r.kernels.len(),
        r.out.display(),
        r.flags.join(" ")
    );
    for k in &r.kernels {
        let pack = match (&k.pack_symbol, &k.prepacked_symbol) {
            (Some(p), Some(q)) => format!(" + {p}, {q}"),
            _ => String::new(),
        };
        println!(
            "  {:<40} {:>9.4} ms {:>7.1} GFLOP/s  {}{pack}",
            k.workload, k.latency_ms, k.gflops, k.symbol
        );
    }
    if r.other_machine > 0 {
        println!(
            "  {} kernel(s) were measured on another machine or build",
            r.other_machine
        );
    }
    println!("  files: {}", r.files.join(", "));
    println!(
        "  C: #include \"tessel_kernels.h\", link -ltessel_kernels -fopenmp; Rust: path dependency on {}",
        r.out.join("rust").display()
    );
}

#[cfg(test)]
mod tests {
    use super::ratio_mark;

    #[test]
    fn a_ratio_is_marked_by_which_ranking_missed() {
        assert_eq!(ratio_mark(0, 0), "");
        assert_eq!(ratio_mark(0, 3), ">=");
        assert_eq!(ratio_mark(1, 0), "<=");
        assert_eq!(ratio_mark(2, 5), "~");
    }
}
