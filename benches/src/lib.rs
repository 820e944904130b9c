pub mod cases;
pub mod cublaslt;
pub mod table;
pub mod timing;
