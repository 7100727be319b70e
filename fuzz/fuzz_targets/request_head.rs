#![no_main]
// See turnpike_proxy::fuzzing::request_head.
libfuzzer_sys::fuzz_target!(|data: &[u8]| turnpike_proxy::fuzzing::request_head(data));
