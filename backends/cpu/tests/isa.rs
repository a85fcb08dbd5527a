//! `FERROFLOW_CPU_ISA` caps the instruction set the kernels use; CI runs this crate's tests
//! at each level (`avx2`, `scalar`) besides the machine's own, so the paths it would not
//! pick by itself are tested too. This checks the cap took effect.

#[test]
fn the_instruction_set_follows_ferroflow_cpu_isa() {
    let isa = ferroflow_cpu::isa();
    match std::env::var("FERROFLOW_CPU_ISA").as_deref() {
        Ok("scalar") => assert_eq!(isa, "scalar"),
        Ok("avx2") => assert!(isa == "avx2" || isa == "scalar", "{isa}"),
        _ => assert!(["avx512", "avx2", "scalar"].contains(&isa), "{isa}"),
    }
    println!("kernels run at {isa}");
}
