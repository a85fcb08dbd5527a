use ferroflow_tensor::{Device, Tensor};
use std::time::Instant;
fn main() -> ferroflow_tensor::Result<()> {
    ferroflow_cuda::emulation::register()?;
    let device = Device::gpu(0);
    ferroflow_tensor::with_device(&device.to_string(), || -> ferroflow_tensor::Result<()> {
        let x = Tensor::from_vec(vec![1.0f32; 16], &[16])?;
        let one = Tensor::from_vec(vec![1e-3f32; 16], &[16])?;
        let chain = || -> ferroflow_tensor::Result<f64> {
            let t = Instant::now();
            let mut y = x.clone();
            for _ in 0..10000 {
                y = y.add(&one)?;
            }
            let _ = y.to_f64_vec()?;
            Ok(t.elapsed().as_secs_f64() * 1e6 / 10000.0)
        };
        chain()?;
        let mut times = (0..7)
            .map(|_| chain())
            .collect::<ferroflow_tensor::Result<Vec<_>>>()?;
        times.sort_by(f64::total_cmp);
        println!("emulated per op: {:.3} us (min {:.3})", times[3], times[0]);
        Ok(())
    })?
}
