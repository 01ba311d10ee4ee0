//! The attention model: gradients reach every variable, the fused inference path equals the
//! candle forward, a tiny model learns a synthetic ranking, files round-trip and bad files fail.

use candle_core::{Device, Tensor};
use tessel_model::ensemble::Companions;
use tessel_model::gbt::TreeRecipe;
use tessel_model::net::{self, InitRng};
use tessel_model::train::{Trainable, rank, split_tasks};
use tessel_model::{
    Dataset, Loss, Model, ModelConfig, ModelError, Sample, TrainOptions, metrics, train,
};

const WIDTH: usize = 8;

fn small_config() -> ModelConfig {
    let mut c = ModelConfig::new(WIDTH);
    c.d_model = 32;
    c.d_ff = 64;
    c.heads = 4;
    c.layers = 2;
    c
}

/// Tasks whose candidates have 3..8 tokens; latency is the exponential of the mean over tokens
/// of a non-linear function of each token (a per-token cost, pooled), plus a per-task offset
/// column that does not change the ranking.
fn synthetic(tasks: usize, per_task: usize, seed: u64) -> Dataset {
    synthetic_with(tasks, per_task, seed, |x| {
        2.0 * x(0) + 1.5 * x(1) * x(1) - x(0) * x(3)
    })
}

/// [`synthetic`] with another per-token cost (`cost(x)`, `x(j)` the token's column j): records
/// of "another platform".
fn synthetic_with(
    tasks: usize,
    per_task: usize,
    seed: u64,
    token_cost: impl Fn(&dyn Fn(usize) -> f64) -> f64,
) -> Dataset {
    let mut rng = InitRng::new(seed);
    let mut samples = Vec::new();
    for task in 0..tasks {
        let offset = rng.unit() as f32;
        for _ in 0..per_task {
            let n = 3 + (rng.next_u64() % 6) as usize;
            let mut tokens = Vec::new();
            let mut cost = 0f64;
            for _ in 0..n {
                let token: Vec<f32> = (0..WIDTH)
                    .map(|j| rng.unit() as f32 + if j == 2 { offset } else { 0.0 })
                    .collect();
                let x = |j: usize| token[j] as f64;
                cost += token_cost(&x);
                tokens.extend(token);
            }
            let latency = (cost / n as f64).exp() * 1e-3;
            samples.push(Sample {
                task,
                tokens,
                latency,
            });
        }
    }
    let keys = (0..tasks).map(|t| (format!("task{t}"), 1.0)).collect();
    Dataset::new(keys, samples, WIDTH).unwrap()
}

fn batch(data: &Dataset, rows: &[usize], model: &Model) -> (Tensor, Tensor) {
    let t_max = rows
        .iter()
        .map(|&i| data.samples[i].tokens.len() / WIDTH)
        .max()
        .unwrap();
    let mut x = vec![0f32; rows.len() * t_max * WIDTH];
    let mut mask = vec![0f32; rows.len() * t_max];
    let mut buf = Vec::new();
    for (r, &i) in rows.iter().enumerate() {
        let s = &data.samples[i];
        model.info.normalizer.apply(&s.tokens, &mut buf);
        x[r * t_max * WIDTH..r * t_max * WIDTH + buf.len()].copy_from_slice(&buf);
        let n = s.tokens.len() / WIDTH;
        mask[r * t_max..r * t_max + n]
            .iter_mut()
            .for_each(|m| *m = 1.0);
    }
    (
        Tensor::from_vec(x, (rows.len(), t_max, WIDTH), &Device::Cpu).unwrap(),
        Tensor::from_vec(mask, (rows.len(), t_max), &Device::Cpu).unwrap(),
    )
}

#[test]
fn every_variable_receives_a_gradient() {
    let data = synthetic(2, 8, 1);
    let model = Model::new(small_config(), 3).unwrap();
    let rows: Vec<usize> = (0..data.samples.len()).collect();
    let (x, mask) = batch(&data, &rows, &model);
    let scores = net::forward(&model.params, model.config(), &x, &mask).unwrap();
    let loss = scores.sqr().unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    for (name, var) in model.params.names.iter().zip(&model.params.vars) {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name} has no gradient"));
        let norm: f32 = g.sqr().unwrap().sum_all().unwrap().to_scalar().unwrap();
        assert!(norm > 0.0, "{name} has a zero gradient");
    }
}

#[test]
fn the_fused_inference_path_equals_the_candle_forward() {
    let data = synthetic(3, 10, 2);
    let mut model = Model::new(small_config(), 4).unwrap();
    // Train a little so that weights are not at their initial symmetry.
    let opts = TrainOptions {
        epochs: 2,
        val_fraction: 0.0,
        ..TrainOptions::default()
    };
    train(&mut model, &data, &opts, &mut |_| {}).unwrap();
    let rows: Vec<usize> = (0..data.samples.len()).collect();
    let (x, mask) = batch(&data, &rows, &model);
    let reference: Vec<f32> = net::forward(&model.params, model.config(), &x, &mask)
        .unwrap()
        .to_vec1()
        .unwrap();
    let fused = model.predict(
        &data
            .samples
            .iter()
            .map(|s| &s.tokens[..])
            .collect::<Vec<_>>(),
    );
    for (a, b) in reference.iter().zip(&fused) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "{a} vs {b}");
    }
}

#[test]
fn a_tiny_model_learns_a_synthetic_ranking() {
    let data = synthetic(16, 48, 7);
    let (train_ids, test_ids) = split_tasks(16, 0.25, 9);
    let (train_set, test_set) = (data.subset(&train_ids), data.subset(&test_ids));
    let mut model = Model::new(small_config(), 5).unwrap();
    let opts = TrainOptions {
        epochs: 12,
        lr: 1e-2,
        steps_per_epoch: Some(20),
        group_size: 16,
        val_fraction: 0.2,
        ..TrainOptions::default()
    };
    let report = train(&mut model, &train_set, &opts, &mut |_| {}).unwrap();
    let ranked = rank(&mut model, &test_set);
    let m = metrics::evaluate(&ranked);
    let random = metrics::random_baseline(&ranked, 20, 1);
    let c = tessel_model::train::compare(&mut model, &train_set, &test_set, 1);
    assert_eq!(c.model, m);
    assert!(
        c.ridge.pairwise_accuracy > c.random.pairwise_accuracy,
        "{c:?}"
    );
    eprintln!("synthetic held-out: {c:?}");
    assert!(
        m.top1 > 0.9,
        "top-1 {:.3} (random {:.3}), epochs {:?}",
        m.top1,
        random.top1,
        report.epochs.iter().map(|e| e.val).collect::<Vec<_>>()
    );
    assert!(
        m.pairwise_accuracy > random.pairwise_accuracy + 0.2,
        "{m:?}"
    );
    assert!(report.epochs.iter().all(|e| e.programs_per_s > 0.0));
}

#[test]
fn training_is_reproducible() {
    let data = synthetic(4, 16, 3);
    let run = || {
        let mut model = Model::new(small_config(), 11).unwrap();
        let opts = TrainOptions {
            epochs: 2,
            seed: 5,
            ..TrainOptions::default()
        };
        train(&mut model, &data, &opts, &mut |_| {}).unwrap();
        model.predict(
            &data
                .samples
                .iter()
                .map(|s| &s.tokens[..])
                .collect::<Vec<_>>(),
        )
    };
    assert_eq!(run(), run());
}

#[test]
fn losses_all_train() {
    let data = synthetic(6, 24, 4);
    for loss in [Loss::LambdaRank, Loss::Pairwise, Loss::Mse] {
        let mut model = Model::new(small_config(), 1).unwrap();
        let opts = TrainOptions {
            epochs: 3,
            loss,
            val_fraction: 0.0,
            ..TrainOptions::default()
        };
        let r = train(&mut model, &data, &opts, &mut |_| {}).unwrap();
        assert!(
            r.epochs.iter().all(|e| e.train_loss.is_finite()),
            "{loss:?}"
        );
    }
}

#[test]
fn frozen_backbone_transfer_changes_only_embedding_and_head() {
    let data = synthetic(4, 16, 8);
    let mut model = Model::new(small_config(), 2).unwrap();
    let before = model.params.snapshot().unwrap();
    let opts = TrainOptions {
        epochs: 2,
        trainable: Trainable::HeadAndEmbedding,
        val_fraction: 0.0,
        ..TrainOptions::default()
    };
    train(&mut model, &data, &opts, &mut |_| {}).unwrap();
    for ((name, var), old) in model
        .params
        .names
        .iter()
        .zip(&model.params.vars)
        .zip(&before)
    {
        let same = var
            .as_tensor()
            .eq(old)
            .unwrap()
            .flatten_all()
            .unwrap()
            .min(0)
            .unwrap()
            .to_scalar::<u8>()
            .unwrap()
            == 1;
        assert_eq!(same, net::is_backbone(name), "{name}");
    }
}

#[test]
fn save_and_load_round_trip_bit_exactly() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("model-roundtrip");
    let data = synthetic(3, 8, 6);
    let mut model = Model::new(small_config(), 9).unwrap();
    let opts = TrainOptions {
        epochs: 1,
        val_fraction: 0.0,
        ..TrainOptions::default()
    };
    train(&mut model, &data, &opts, &mut |_| {}).unwrap();
    let path = dir.join("m.safetensors");
    model.save(&path).unwrap();
    let mut loaded = Model::load(&path).unwrap();
    assert_eq!(loaded.info.config, model.info.config);
    assert_eq!(loaded.info.normalizer, model.info.normalizer);
    let inputs: Vec<&[f32]> = data.samples.iter().map(|s| &s.tokens[..]).collect();
    let (a, b) = (model.predict(&inputs), loaded.predict(&inputs));
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

#[test]
fn bad_model_files_are_clear_errors() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("model-bad");
    let model = Model::new(small_config(), 1).unwrap();
    let path = dir.join("m.safetensors");
    model.save(&path).unwrap();
    let (weights, json) = Model::paths(&path);

    // Another feature schema: loads, but refuses features of this one.
    let text = std::fs::read_to_string(&json).unwrap();
    let ours = format!("\"feature_schema\": {}", tessel_features::SCHEMA_VERSION);
    assert!(text.contains(&ours), "{text}");
    let other = text.replace(&ours, "\"feature_schema\": 999");
    std::fs::write(&json, &other).unwrap();
    let m = Model::load(&path).unwrap();
    let err = m.check_schema(tessel_features::SCHEMA_VERSION).unwrap_err();
    assert!(
        matches!(err, ModelError::Schema { model: 999, .. }),
        "{err}"
    );
    std::fs::write(&json, &text).unwrap();

    // A truncated weights file.
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let err = Model::load(&path).err().unwrap();
    assert!(matches!(err, ModelError::Format { .. }), "{err}");
    assert!(err.to_string().contains("m.safetensors"), "{err}");

    // Weights of another architecture.
    let mut wide = small_config();
    wide.d_model = 64;
    Model::new(wide, 1).unwrap().save(&path).unwrap();
    std::fs::write(&json, &text).unwrap();
    let err = Model::load(&path).err().unwrap();
    assert!(matches!(err, ModelError::Shape { .. }), "{err}");

    // Garbage JSON and a missing file.
    std::fs::write(&json, "{not json").unwrap();
    assert!(matches!(Model::load(&path), Err(ModelError::Format { .. })));
    assert!(matches!(
        Model::load(&dir.join("absent.safetensors")),
        Err(ModelError::Io { .. })
    ));
}

/// An AVX2 + FMA machine of one core, as the features see it.
fn avx2_target() -> tessel_features::Target {
    tessel_features::Target::cpu(
        "t",
        &["avx2".into(), "fma".into()],
        1,
        &std::collections::BTreeMap::new(),
        None,
    )
}

#[test]
fn the_cost_model_scores_programs_and_learns_online() {
    use tessel_features::WIDTH as FEATURES;
    use tessel_measure::{CostModel, Measurement, Timing};
    use tessel_model::ModelCostModel;
    use tessel_model::cost::OnlineOptions;
    use tessel_search::rng::Rng;
    use tessel_search::{InstructionSet, Space};

    let op = "gemm:m=64,n=64,k=64,dtype=f32"
        .parse::<tessel_ir::Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &InstructionSet::Only(vec!["avx2.vfmadd231ps".into()]));
    let mut rng = Rng::new(1);
    let programs: Vec<tessel_ir::Program> = (0..12)
        .filter_map(|_| space.lower(&space.sample(&mut rng)).ok().map(|(_, p)| p))
        .collect();
    let refs: Vec<&tessel_ir::Program> = programs.iter().collect();
    let target = avx2_target();
    let mut config = ModelConfig::new(FEATURES);
    config.d_model = 16;
    config.heads = 2;
    config.d_ff = 32;
    let model = Model::new(config, 1).unwrap();
    let mut cm = ModelCostModel::new(model, target, "test", OnlineOptions::default());
    let before = cm.predict(&refs);
    assert_eq!(before.len(), refs.len());
    assert!(before.iter().all(|s| s.is_finite()));
    let results: Vec<_> = (0..refs.len())
        .map(|i| {
            Ok(Measurement {
                timing: Timing::from_samples(&[1e-3 * (1.0 + i as f64)]).unwrap(),
                compile_time_s: 0.1,
                max_error: 0.0,
                emulated: false,
                gflops: 1.0,
                cut_short: false,
                censored: false,
                allocation_spread: None,
                kernel: None,
            })
        })
        .collect();
    cm.update(&refs, &results);
    let after = cm.predict(&refs);
    assert_ne!(before, after, "online steps change the scores");
}

#[test]
fn transfer_to_a_shifted_platform_beats_training_from_scratch_on_few_records() {
    // Platform B: same tasks shape, every column shifted; 8 records per task.
    let a = synthetic(12, 48, 21);
    let mut b = synthetic(6, 48, 22);
    for s in b.samples.iter_mut() {
        s.tokens.iter_mut().for_each(|v| *v += 0.1);
    }
    let (few_ids, test_ids) = split_tasks(6, 0.5, 3);
    let test = b.subset(&test_ids);
    let few = {
        let d = b.subset(&few_ids);
        let keep: Vec<Sample> = d
            .by_task()
            .iter()
            .flat_map(|g| g.iter().take(8))
            .map(|&i| d.samples[i].clone())
            .collect();
        Dataset::new(d.tasks.clone(), keep, WIDTH).unwrap()
    };
    let pre = TrainOptions {
        epochs: 10,
        lr: 1e-2,
        steps_per_epoch: Some(20),
        group_size: 16,
        val_fraction: 0.0,
        ..TrainOptions::default()
    };
    let mut pretrained = Model::new(small_config(), 1).unwrap();
    train(&mut pretrained, &a, &pre, &mut |_| {}).unwrap();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("transfer/a.safetensors");
    pretrained.save(&path).unwrap();
    let mut tuned = Model::load(&path).unwrap();
    let opts = tessel_model::train::transfer_options(
        Trainable::All,
        &TrainOptions {
            epochs: 5,
            ..pre.clone()
        },
    );
    train(&mut tuned, &few, &opts, &mut |_| {}).unwrap();
    let mut scratch = Model::new(small_config(), 1).unwrap();
    train(
        &mut scratch,
        &few,
        &TrainOptions {
            epochs: 5,
            ..pre.clone()
        },
        &mut |_| {},
    )
    .unwrap();
    let t = metrics::evaluate(&rank(&mut tuned, &test));
    let s = metrics::evaluate(&rank(&mut scratch, &test));
    assert!(
        t.pairwise_accuracy > s.pairwise_accuracy,
        "transfer {t:?} scratch {s:?}"
    );
}

/// Model files as a user may hand them over: arbitrary JSON and safetensors bytes are an
/// error naming the file, never a panic.
#[test]
fn arbitrary_model_files_are_errors_not_panics() {
    use proptest::prelude::*;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("model-fuzz");
    std::fs::create_dir_all(&dir).unwrap();
    let model = Model::new(small_config(), 1).unwrap();
    model.save(&dir.join("good")).unwrap();
    let json = std::fs::read(dir.join("good.json")).unwrap();
    let weights = std::fs::read(dir.join("good.safetensors")).unwrap();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(200));
    runner
        .run(
            &(any::<bool>(), any::<usize>(), any::<u8>(), any::<bool>()),
            |(which, at, byte, cut)| {
                let (mut j, mut w) = (json.clone(), weights.clone());
                let target = if which { &mut j } else { &mut w };
                let at = at % target.len();
                if cut {
                    target.truncate(at);
                } else {
                    target[at] = byte;
                }
                std::fs::write(dir.join("bad.json"), &j).unwrap();
                std::fs::write(dir.join("bad.safetensors"), &w).unwrap();
                if let Err(e) = Model::load(&dir.join("bad")) {
                    prop_assert!(e.to_string().contains("bad."), "{e}");
                }
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn the_roofline_prior_adds_to_the_network_score_and_is_saved() {
    use tessel_features::{WIDTH as FEATURES, extract};
    use tessel_model::prior_score;
    use tessel_search::rng::Rng;
    use tessel_search::{InstructionSet, Space};

    let op = "gemm:m=64,n=64,k=64,dtype=f32"
        .parse::<tessel_ir::Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &InstructionSet::Only(vec!["avx2.vfmadd231ps".into()]));
    let target = avx2_target();
    let mut rng = Rng::new(3);
    let tokens: Vec<Vec<f32>> = (0..8)
        .filter_map(|_| space.lower(&space.sample(&mut rng)).ok())
        .map(|(_, p)| extract(&p, &target).unwrap().tokens)
        .collect();
    let programs: Vec<&[f32]> = tokens.iter().map(|t| &t[..]).collect();
    let mut config = ModelConfig::new(FEATURES);
    config.d_model = 16;
    config.heads = 2;
    config.d_ff = 32;
    let mut plain = Model::new(config.clone(), 1).unwrap();
    config.prior = true;
    let mut with_prior = Model::new(config, 1).unwrap();
    let (a, b) = (plain.predict(&programs), with_prior.predict(&programs));
    for ((x, y), t) in a.iter().zip(&b).zip(&programs) {
        let p = prior_score(t, FEATURES);
        assert!(p.is_finite() && p != 0.0, "a real program has an estimate");
        assert!((y - (x + p)).abs() < 1e-4, "{y} != {x} + {p}");
    }
    // Tokens of another width carry no prior.
    assert_eq!(prior_score(&[0.0; 8], 4), 0.0);
    let dir = std::env::temp_dir().join(format!("tessel-prior-{}", std::process::id()));
    with_prior.save(&dir.join("m")).unwrap();
    let mut loaded = Model::load(&dir.join("m")).unwrap();
    assert!(loaded.config().prior);
    assert_eq!(loaded.predict(&programs), b);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_roofline_cost_model_puts_the_classic_gemm_ahead_of_the_naive_loops() {
    use tessel_measure::CostModel;
    use tessel_model::RooflineCostModel;
    use tessel_search::{InstructionSet, Space};

    let op = "gemm:m=256,n=256,k=256,dtype=f32"
        .parse::<tessel_ir::Workload>()
        .unwrap()
        .to_op();
    // The classic register-blocked seed on the FMA, and the naive loop nest.
    let fma = Space::new(&op, &InstructionSet::Only(vec!["avx2.vfmadd231ps".into()]));
    let classic = fma.lower(&fma.seeds()[0]).unwrap().1;
    let loops = tessel_ir::Trace::new().lower(&op, &()).unwrap();
    let target = avx2_target();
    let mut cm = RooflineCostModel::new(target);
    assert_eq!(cm.name(), "roofline");
    let s = cm.predict(&[&classic, &loops]);
    assert!(s.iter().all(|x| x.is_finite()), "{s:?}");
    assert!(s[0] > s[1], "classic {} vs loops {}", s[0], s[1]);
}

/// A fresh network and the trees fitted beside it on `train`: the shipped ensemble.
fn with_companions(train: &Dataset) -> Model {
    let mut model = Model::new(small_config(), 3).unwrap();
    model.fit_companions(train, 1).unwrap();
    model
}

#[test]
fn the_ensemble_ships_beside_the_model_and_ranks_what_the_network_alone_cannot() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("model-ensemble");
    let (train_set, test_set) = (synthetic(6, 40, 11), synthetic(4, 30, 12));
    let mut model = with_companions(&train_set);
    // An untrained network ranks at chance; its trees learned the synthetic cost (from 240
    // records: 0.73 of pairs).
    let network = metrics::evaluate(&rank(&mut model, &test_set));
    let ensemble = metrics::evaluate(&tessel_model::train::rank_ensemble(&mut model, &test_set));
    assert!(
        ensemble.pairwise_accuracy > 0.7
            && ensemble.pairwise_accuracy > network.pairwise_accuracy + 0.15,
        "ensemble {ensemble:?}, network {network:?}"
    );

    // The trees column of a comparison can come from the companions: the same fit as the
    // one `compare` makes, so the same figures.
    let c = model.companions.clone().expect("fitted");
    let fitted_again = tessel_model::train::compare(&mut model, &train_set, &test_set, 1);
    let reused =
        tessel_model::train::compare_with_trees(&mut model, &train_set, &test_set, 1, Some(&c));
    assert_eq!(fitted_again.gbt, reused.gbt);

    // Saved and loaded: the same scores, bit for bit.
    let path = dir.join("m");
    model.save(&path).unwrap();
    let ensemble_file = tessel_model::Companions::path(&path);
    assert_eq!(ensemble_file, dir.join("m.ensemble.json.gz"));
    let mut loaded = Model::load(&path).unwrap();
    assert!(loaded.companions.is_some());
    let tokens: Vec<&[f32]> = test_set.samples.iter().map(|s| &s.tokens[..]).collect();
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    assert_eq!(
        bits(model.predict_ranking(&tokens)),
        bits(loaded.predict_ranking(&tokens))
    );
    // A candidate's score does not depend on the others scored with it.
    let alone = loaded.predict_ranking(&tokens[..1]);
    assert_eq!(
        bits(alone),
        bits(loaded.predict_ranking(&tokens)[..1].to_vec())
    );

    // A network saved without companions to the same path removes the old file, which
    // would otherwise be read with it.
    let mut plain = loaded.duplicate().unwrap();
    plain.companions = None;
    plain.save(&path).unwrap();
    assert!(!ensemble_file.exists());
    assert!(Model::load(&path).unwrap().companions.is_none());
}

#[test]
fn trees_fitted_again_on_every_task_keep_their_mix_and_recipe() {
    let all = synthetic(10, 30, 23);
    let (train_set, val_set) = (all.subset(&[0, 1, 2, 3, 4, 5]), all.subset(&[6, 7, 8, 9]));
    let mut model = Model::new(small_config(), 3).unwrap();
    // Without trees there is nothing to fit again.
    let e = model.refit_companions(&all, 1).unwrap_err();
    assert!(e.to_string().contains("no trees"), "{e}");
    model
        .fit_companions_judged(&train_set, &val_set, 1, &Default::default())
        .unwrap();
    let before = model.companions.clone().unwrap();
    assert_eq!((before.records, before.tasks), (180, 6));
    model.refit_companions(&all, 1).unwrap();
    let after = model.companions.clone().unwrap();
    // The validation tasks now count too; the mix chosen on them and the recipe stay.
    assert_eq!((after.records, after.tasks), (300, 10));
    assert_eq!(after.weights, before.weights);
    assert_eq!(after.recipe, before.recipe);
    // New trees, so new scores: a record of a validation task ranks differently.
    let tokens: Vec<&[f32]> = val_set.samples.iter().map(|s| &s.tokens[..]).collect();
    let mut old = model.duplicate().unwrap();
    old.companions = Some(before);
    assert_ne!(model.predict_ranking(&tokens), old.predict_ranking(&tokens));
}

#[test]
fn the_mix_is_chosen_on_validation_tasks_and_saved_with_the_trees() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("model-ensemble-mix");
    let (train_set, val_set) = (synthetic(6, 40, 21), synthetic(4, 30, 22));
    let mut model = Model::new(small_config(), 3).unwrap();
    let choice = model
        .fit_companions_judged(&train_set, &val_set, 1, &Default::default())
        .unwrap();
    // Every share was tried, and the one kept scores best.
    assert_eq!(
        choice.tried.len(),
        tessel_model::ensemble::TREE_SHARES.len()
    );
    let best = choice.tried.iter().map(|t| t.1).fold(f64::MIN, f64::max);
    let kept = choice
        .tried
        .iter()
        .find(|t| t.0 == choice.tree_share)
        .unwrap();
    assert_eq!(kept.1, best);
    // An untrained network ranks at chance; the trees learned the cost: they get more say.
    assert!(choice.tree_share > 0.5, "{choice:?}");
    assert_eq!((choice.tasks, choice.records), (4, 120));
    let weights = model.companions.as_ref().unwrap().weights;
    assert!((weights.tree_share() - choice.tree_share).abs() < 1e-12);

    // The weights travel with the trees.
    let path = dir.join("m");
    model.save(&path).unwrap();
    let mut loaded = Model::load(&path).unwrap();
    assert_eq!(loaded.companions.as_ref().unwrap().weights, weights);
    let tokens: Vec<&[f32]> = val_set.samples.iter().map(|s| &s.tokens[..]).collect();
    assert_eq!(
        model.predict_ranking(&tokens),
        loaded.predict_ranking(&tokens)
    );
}

#[test]
fn a_correction_learns_what_the_carried_ensemble_orders_wrongly_on_another_platform() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("model-correction");
    // Pretrained where column 1 costs; on the new platform it saves time instead.
    let source = synthetic(6, 40, 41);
    let new_cost = |x: &dyn Fn(usize) -> f64| 2.0 * x(0) - 1.5 * x(1) * x(1) - x(0) * x(3);
    let (shots, test) = (
        synthetic_with(8, 12, 42, new_cost),
        synthetic_with(4, 30, 43, new_cost),
    );
    let mut carried = with_companions(&source);
    let before = metrics::evaluate(&tessel_model::train::rank_ensemble(&mut carried, &test));
    let trees = carried.companions.clone().unwrap();
    let scores = carried.predict(&tessel_model::train::sample_tokens(&shots));
    let corrected = trees
        .corrected(
            &shots,
            &scores,
            1,
            &tessel_model::ensemble::CORRECTION_RECIPE,
        )
        .unwrap();
    assert_eq!(corrected.corrections.len(), 1);
    assert_eq!(
        (
            corrected.corrections[0].records,
            corrected.corrections[0].tasks
        ),
        (96, 8)
    );
    let mut model = carried.duplicate().unwrap();
    model.companions = Some(std::sync::Arc::new(corrected));
    let after = metrics::evaluate(&tessel_model::train::rank_ensemble(&mut model, &test));
    assert!(
        after.pairwise_accuracy > before.pairwise_accuracy + 0.1,
        "corrected {after:?}, carried {before:?}"
    );

    // The correction travels with the trees: the same scores once loaded.
    let path = dir.join("m");
    model.save(&path).unwrap();
    let mut loaded = Model::load(&path).unwrap();
    assert_eq!(loaded.companions.as_ref().unwrap().corrections.len(), 1);
    let tokens = tessel_model::train::sample_tokens(&test);
    assert_eq!(
        model.predict_ranking(&tokens),
        loaded.predict_ranking(&tokens)
    );
    // A damaged correction is an error naming it, not a panic in the middle of a search.
    let file = Companions::path(&path);
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(&std::fs::read(&file).unwrap()[..]),
        &mut text,
    )
    .unwrap();
    let at = text
        .find("\"corrections\":")
        .expect("the correction is saved");
    for (what, damaged) in [
        ("a regression correction", "\"objective\":\"regression\""),
        ("more bags than boosters", "\"bags\":2"),
    ] {
        let key = damaged.split(':').next().unwrap();
        let from = at + text[at..].find(key).unwrap();
        let to = from + text[from..].find([',', '}']).unwrap();
        let bad = format!("{}{damaged}{}", &text[..from], &text[to..]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, bad.as_bytes()).unwrap();
        std::fs::write(&file, gz.finish().unwrap()).unwrap();
        let err = Model::load(&path)
            .err()
            .unwrap_or_else(|| panic!("{what} loaded"));
        assert!(err.to_string().contains("correction 0"), "{what}: {err}");
    }

    // A correction only learns an order, and needs one score per record.
    let regression = TreeRecipe::default();
    let err = trees
        .corrected(&shots, &scores, 1, &regression)
        .err()
        .unwrap();
    assert!(err.to_string().contains("lambdarank"), "{err}");
    let err = trees
        .corrected(
            &shots,
            &scores[1..],
            1,
            &tessel_model::ensemble::CORRECTION_RECIPE,
        )
        .err()
        .unwrap();
    assert!(err.to_string().contains("model scores"), "{err}");
}

#[test]
fn bagged_trees_are_saved_with_their_recipe_and_score_the_same_when_loaded() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("model-ensemble-bags");
    let (train_set, val_set) = (synthetic(6, 40, 31), synthetic(4, 30, 32));
    let recipe: TreeRecipe = "rounds=40,subsample=0.7,colsample=0.8,bags=3"
        .parse()
        .unwrap();
    let mut model = Model::new(small_config(), 3).unwrap();
    model
        .fit_companions_judged(&train_set, &val_set, 1, &recipe)
        .unwrap();
    let c = model.companions.as_ref().unwrap();
    assert_eq!((c.recipe, c.trees.bags()), (recipe, 3));
    // The bag still learns the synthetic cost the network (untrained) cannot.
    let ensemble = metrics::evaluate(&tessel_model::train::rank_ensemble(&mut model, &val_set));
    assert!(ensemble.pairwise_accuracy > 0.7, "{ensemble:?}");
    let path = dir.join("m");
    model.save(&path).unwrap();
    let mut loaded = Model::load(&path).unwrap();
    assert_eq!(loaded.companions.as_ref().map(|c| c.recipe), Some(recipe));
    let tokens: Vec<&[f32]> = val_set.samples.iter().map(|s| &s.tokens[..]).collect();
    assert_eq!(
        model.predict_ranking(&tokens),
        loaded.predict_ranking(&tokens)
    );
}

#[test]
fn bad_ensemble_files_are_clear_errors_not_panics() {
    use proptest::prelude::*;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("model-ensemble-bad");
    let train_set = synthetic(3, 20, 5);
    let model = with_companions(&train_set);
    model.save(&dir.join("good")).unwrap();
    let gzip = |text: &[u8]| {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, text).unwrap();
        gz.finish().unwrap()
    };
    let packed = std::fs::read(dir.join("good.ensemble.json.gz")).unwrap();
    let mut good = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&packed[..]), &mut good)
        .unwrap();
    let copy_model = |name: &str| {
        for ext in ["json", "safetensors"] {
            std::fs::copy(
                dir.join(format!("good.{ext}")),
                dir.join(format!("{name}.{ext}")),
            )
            .unwrap();
        }
    };
    copy_model("bad");
    let load_with = |text: &str| {
        std::fs::write(dir.join("bad.ensemble.json.gz"), gzip(text.as_bytes())).unwrap();
        Model::load(&dir.join("bad"))
    };
    for (what, text) in [
        ("garbage", "{not json".to_string()),
        (
            "another format",
            good.replacen("tessel-ensemble", "tessel-other", 1),
        ),
        (
            "another width",
            good.replacen("\"width\":8", "\"width\":9", 1),
        ),
        (
            "an unknown kind of rows",
            good.replacen("\"rows\":\"grouped\"", "\"rows\":\"sideways\"", 1),
        ),
        (
            "negative weights",
            good.replacen("\"weights\":{", "\"weights\":{\"model\":-1,\"was\":", 1),
        ),
        (
            "a recipe of more bags than boosters",
            good.replacen("\"bags\":1", "\"bags\":2", 1),
        ),
        (
            "a recipe out of range",
            good.replacen("\"depth\":6", "\"depth\":0", 1),
        ),
        (
            "a zero scale",
            good.replacen(
                "\"scales\":{\"model\":",
                "\"scales\":{\"model\":0,\"was\":",
                1,
            ),
        ),
    ] {
        let err = load_with(&text)
            .err()
            .unwrap_or_else(|| panic!("{what} loaded"));
        assert!(matches!(err, ModelError::Format { .. }), "{what}: {err}");
        assert!(
            err.to_string().contains("bad.ensemble.json.gz"),
            "{what}: {err}"
        );
    }
    // A file written before weights were chosen counts both parts alike.
    assert!(good.contains("\"weights\":{"));
    let start = good.find("\"weights\":{").unwrap();
    let end = start + good[start..].find('}').unwrap() + 2;
    let old = load_with(&format!("{}{}", &good[..start], &good[end..])).unwrap();
    let w = old.companions.as_ref().map(|c| c.weights);
    assert_eq!(
        w,
        Some(tessel_model::ensemble::Weights {
            model: 1.0,
            trees: 1.0
        })
    );
    // A file written before recipes were recorded was grown by the default one.
    let start = good.find("\"recipe\":{").unwrap();
    let end = start + good[start..].find('}').unwrap() + 2;
    let old = load_with(&format!("{}{}", &good[..start], &good[end..])).unwrap();
    assert_eq!(
        old.companions.as_ref().map(|c| c.recipe),
        Some(TreeRecipe::default())
    );
    // A file written before the trees' rows were named was fitted on pooled rows.
    assert!(good.contains("\"rows\":\"grouped\","));
    let old = load_with(&good.replacen("\"rows\":\"grouped\",", "", 1)).unwrap();
    let rows = old.companions.as_ref().map(|c| c.rows);
    assert_eq!(rows, Some(tessel_model::rows::RowKind::Pooled));
    // Not compressed, or cut short after compression.
    for (what, bytes) in [
        ("plain JSON", good.as_bytes().to_vec()),
        ("cut short", packed[..packed.len() / 2].to_vec()),
    ] {
        std::fs::write(dir.join("bad.ensemble.json.gz"), bytes).unwrap();
        let err = Model::load(&dir.join("bad")).err().unwrap();
        assert!(err.to_string().contains("not gzip"), "{what}: {err}");
    }
    // Any byte changed or the file cut short: an error naming the file, or a model that
    // scores without panicking.
    let tokens: Vec<&[f32]> = train_set.samples.iter().map(|s| &s.tokens[..]).collect();
    let bytes = good.into_bytes();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(100));
    runner
        .run(
            &(any::<usize>(), any::<u8>(), any::<bool>()),
            |(at, byte, cut)| {
                let mut b = bytes.clone();
                let at = at % b.len();
                if cut {
                    b.truncate(at);
                } else {
                    b[at] = byte;
                }
                std::fs::write(dir.join("bad.ensemble.json.gz"), gzip(&b)).unwrap();
                match Model::load(&dir.join("bad")) {
                    Err(e) => prop_assert!(e.to_string().contains("bad.ensemble.json"), "{e}"),
                    Ok(mut m) => prop_assert_eq!(m.predict_ranking(&tokens).len(), tokens.len()),
                }
                Ok(())
            },
        )
        .unwrap();
}

/// The paired gain that decides a transfer: one ranking's gain over another is the other's
/// loss, and a shift common to both tasks' values cancels.
#[test]
fn the_paired_gain_is_antisymmetric_and_ignores_what_both_share() {
    use proptest::prelude::*;
    use tessel_model::metrics::paired_gain;
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(300));
    runner
        .run(
            &(
                proptest::collection::vec((0.0f64..1.0, 0.0f64..1.0), 0..60),
                -0.5f64..0.5,
            ),
            |(pairs, shift)| {
                let (a, b): (Vec<f64>, Vec<f64>) = pairs.into_iter().unzip();
                let (ab, ba) = (paired_gain(&a, &b), paired_gain(&b, &a));
                prop_assert!((ab.mean + ba.mean).abs() < 1e-12);
                prop_assert_eq!(ab.standard_error, ba.standard_error);
                prop_assert_eq!(ab.tasks, a.len());
                prop_assert!(!ab.z().is_nan());
                prop_assert!(ab.z() == -ba.z() || (ab.z() + ba.z()).abs() < 1e-9);
                let shifted = |v: &[f64]| v.iter().map(|x| x + shift).collect::<Vec<_>>();
                let s = paired_gain(&shifted(&a), &shifted(&b));
                prop_assert!((s.mean - ab.mean).abs() < 1e-9);
                prop_assert!(
                    (s.standard_error - ab.standard_error).abs() < 1e-9
                        || (s.standard_error.is_infinite() && ab.standard_error.is_infinite())
                );
                Ok(())
            },
        )
        .unwrap();
}
