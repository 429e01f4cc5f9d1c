fn main() {
    let _ = kwk_eval::runner::TokenStream::clone;
}
