//! `kernels/norm.cu` against the CPU backend's zero-centred RMSNorm.

use limelight::backend::BackendTypes;
use limelight::backend::backbone::BackboneOps;
use limelight::backend::cuda::norm;

use crate::harness::Ctx;

pub fn run(ctx: &mut Ctx) {
    for (rows, cols) in [(1, 2048), (7, 2048), (130, 256), (3, 1000)] {
        let x = ctx.random_bf16(rows, cols, 3.0);
        let w = ctx.random(1, cols, 0.5);
        let eps = 1e-6;
        let cpu_w = ctx.cpu.upload_f32(&[cols], w.data.clone());
        let gpu_w = ctx.cuda.upload_f32(&[cols], w.data.clone());
        let want = ctx.cpu.rms_norm(&x, &cpu_w, eps);
        let gx = ctx.cuda.upload_matrix(&x);
        let got = ctx.cuda.to_host(&norm::rms_norm(ctx.cuda, &gx, &gpu_w, eps));
        ctx.rel_l2(format!("rms_norm_zc [{rows},{cols}]"), &got.data, &want.data, 1e-2);

        // Fused add + norm: the residual must equal the bf16 sum, the output its norm.
        let d = ctx.random_bf16(rows, cols, 3.0);
        let mut sum = x.clone();
        ctx.cpu.add_in_place(&mut sum, &d);
        let want_y = ctx.cpu.rms_norm(&limelight::backend::cuda::tensor::round_to_bf16(&sum), &cpu_w, eps);
        let mut gres = ctx.cuda.upload_matrix(&x);
        let gd = ctx.cuda.upload_matrix(&d);
        let gy = norm::add_rms_norm(ctx.cuda, &mut gres, &gd, &gpu_w, eps);
        let got_res = ctx.cuda.to_host(&gres);
        let got_y = ctx.cuda.to_host(&gy);
        ctx.rel_l2(format!("add_rms_norm_zc residual [{rows},{cols}]"), &got_res.data, &sum.data, 4e-3);
        ctx.rel_l2(format!("add_rms_norm_zc output [{rows},{cols}]"), &got_y.data, &want_y.data, 1e-2);
    }
}
