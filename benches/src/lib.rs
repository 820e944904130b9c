pub mod bsr;
pub mod cases;
pub mod cublaslt;
pub mod engine;
pub mod fused;
pub mod grouped;
pub mod table;
pub mod timing;
