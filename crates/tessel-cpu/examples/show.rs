use tessel_cpu::reference::reference_gemm;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let w: tessel_ir::Workload = args[1].parse().unwrap();
    let id = &args[2];
    let t = reference_gemm(&w, id, None).unwrap();
    let cat = tessel_intrin::Catalog::default();
    let p = t.lower(&w.to_op(), &cat).unwrap();
    println!("{p}");
    let k = tessel_cpu::generate(&p, "k0", &cat).unwrap();
    println!("{}", k.source);
}
