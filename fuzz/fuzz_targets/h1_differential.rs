#![no_main]
// See turnpike_proxy::fuzzing::h1_differential.
libfuzzer_sys::fuzz_target!(|data: &[u8]| turnpike_proxy::fuzzing::h1_differential(data));
